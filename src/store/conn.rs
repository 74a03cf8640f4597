//! How a room reaches Redis. One `Connector` per service (see `Room`): it opens the connection
//! lazily, on the caller's runtime, and hands out cheap clones of it.
//!
//! Only a single Redis URL is served today; cluster and sentinel targets are refused by the
//! configuration until they are implemented here.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::StoreError;
use crate::config::{RedisConfig, RedisTarget};

/// A connection usable by the scripts and commands of `Room`.
pub type RedisConn = ConnectionManager;

pub struct Connector {
    client: redis::Client,
    timeout: Duration,
    conn: OnceCell<RedisConn>,
}

impl Connector {
    pub fn new(config: &RedisConfig) -> Result<Connector, StoreError> {
        let url = match &config.target {
            RedisTarget::Url(url) => url,
            other => return Err(StoreError::Reply(format!("unsupported redis target {other:?}"))),
        };
        Ok(Connector {
            client: redis::Client::open(url.as_str())?,
            timeout: config.timeout,
            conn: OnceCell::new(),
        })
    }

    /// A clone of the service's connection, opening it on first use.
    pub async fn get(&self) -> Result<RedisConn, StoreError> {
        let manager = self
            .conn
            .get_or_try_init(|| async {
                // Reconnect quickly and give up on a dead socket quickly: a proxy in front of a
                // checkout must notice a Redis that came back within a second or so.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(250))
                    .set_number_of_retries(2);
                ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            })
            .await?;
        Ok(manager.clone())
    }
}
