//! Connection slots (contract section 16): how many connections are open on `listen`, in all and
//! per peer address, counted where the listener's filter and the loop can both read them.

use super::*;

/// Connections open on `listen`, shared by the listener's filter and [`Guarded`].
pub struct Connections {
    pub(super) process: Arc<Process>,
    open: AtomicUsize,
    /// Open connections per peer IP, counted whether or not `max_connections_per_address` is on,
    /// so a reload that turns it on finds the connections already open. An address leaves the map
    /// with its last connection: the map never holds more entries than there are connections.
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

/// Which limit refused a connection: the `limit` label of `waitroom_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    Total,
    PerAddress,
}

impl Connections {
    pub fn new(process: Arc<Process>) -> Arc<Connections> {
        Arc::new(Connections { process, open: AtomicUsize::new(0), by_address: Mutex::new(HashMap::new()) })
    }

    /// `max_connections` and `max_connections_per_address` as the running settings have them.
    fn max(&self) -> (usize, usize) {
        let settings = self.process.settings();
        let limits = &settings.config.limits;
        (limits.max_connections, limits.max_connections_per_address)
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub(super) fn by_address(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.by_address.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a connection from `ip` would be refused now, without taking anything.
    pub(super) fn refuses(&self, ip: Option<IpAddr>) -> Option<Refused> {
        let (max, per_address) = self.max();
        if self.open() >= max {
            return Some(Refused::Total);
        }
        let ip = ip.filter(|_| per_address > 0)?;
        (self.by_address().get(&ip).copied().unwrap_or(0) >= per_address).then_some(Refused::PerAddress)
    }

    /// A slot for one more connection from `ip` (the peer's, when the socket tells it), or which
    /// limit refuses it.
    pub(super) fn take(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Slot, Refused> {
        let (max, per_address) = self.max();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .map_err(|_| Refused::Total)?;
        // From here on the slot frees what it took when dropped, refused or not.
        let mut slot = Slot { connections: self.clone(), ip: None };
        metrics::OPEN_CONNECTIONS.inc();
        if let Some(ip) = ip {
            let mut by_address = self.by_address();
            // A refused address has connections open, so no empty entry is left behind.
            let count = by_address.entry(ip).or_insert(0);
            if per_address > 0 && *count >= per_address {
                return Err(Refused::PerAddress);
            }
            *count += 1;
            slot.ip = Some(ip);
        }
        Ok(slot)
    }
}

/// The peer's IP, v4-mapped IPv6 as IPv4: one client is one address whichever way the listener
/// was bound.
pub(super) fn peer_ip(addr: &std::net::SocketAddr) -> IpAddr {
    addr.ip().to_canonical()
}

/// One open connection; dropping it (with the connection's stream) frees the slot.
pub(super) struct Slot {
    connections: Arc<Connections>,
    /// The address the connection is counted under, if any.
    ip: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut by_address = self.connections.by_address();
            if let Some(count) = by_address.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    by_address.remove(&ip);
                }
            }
        }
        self.connections.open.fetch_sub(1, Ordering::AcqRel);
        metrics::OPEN_CONNECTIONS.dec();
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

pub(super) fn refused(limit: Refused) {
    let label = match limit {
        Refused::Total => "max_connections",
        Refused::PerAddress => "max_connections_per_address",
    };
    metrics::CONNECTIONS_CLOSED_TOTAL.with_label_values(&[label]).inc();
}

/// The listener's early cut: at `max_connections`, or at `max_connections_per_address` for the
/// peer's IP, a new connection is closed in the accept loop itself, before pingora spawns a task
/// for it.
pub struct AtCapacity(pub Arc<Connections>);

impl std::fmt::Debug for AtCapacity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AtCapacity(open: {})", self.0.open())
    }
}

#[async_trait]
impl ConnectionFilter for AtCapacity {
    async fn should_accept(&self, addr: Option<&std::net::SocketAddr>) -> bool {
        match self.0.refuses(addr.map(peer_ip)) {
            Some(limit) => {
                refused(limit);
                false
            }
            None => true,
        }
    }
}

