//! Everything pingora asks of a stream besides reading and writing, passed to the socket inside
//! the [`LimitedStream`].

use super::*;

#[async_trait]
impl Shutdown for LimitedStream {
    async fn shutdown(&mut self) {
        let (inner, pending) = (&mut self.inner, &mut self.pending);
        // Whatever was gathered goes out before the close; a failed send has nothing left to save.
        let _ = std::future::poll_fn(|cx| Self::poll_drain(inner, pending, cx)).await;
        self.inner.shutdown().await
    }
}

impl UniqueID for LimitedStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for LimitedStream {
    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for LimitedStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for LimitedStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for LimitedStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for LimitedStream {
    // pingora peeks only for an h2c preface, which `listen` does not serve; a peek would bypass
    // the head deadline, so there is none.
}

