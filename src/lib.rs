//! waitroom: a waiting-room reverse proxy on pingora. A stampede on the order API becomes a fair,
//! capped line in Redis, drained at the rate the backend can take.
//!
//! Reading order: `main` -> [`config`] -> [`server`] (services) -> [`proxy`] (the request
//! phases and one module per endpoint) -> [`rules`] (the queue's arithmetic) -> [`store`] (Redis
//! and the scripts in `lua/`).

pub mod admin;
pub mod cli;
pub mod config;
pub mod connection;
pub mod health;
pub mod http1;
pub mod identity;
pub mod lifecycle;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod page;
pub mod paths;
pub mod periodic;
pub mod policy;
pub mod process;
pub mod proxy;
pub mod room;
pub mod rules;
pub mod server;
pub mod services;
pub mod store;
