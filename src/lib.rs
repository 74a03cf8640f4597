//! waitroom: a waiting-room reverse proxy on pingora. A stampede on the order API becomes a fair,
//! capped line in Redis, drained at the rate the backend can take.
//!
//! Reading order: `main` -> [`config`] -> [`server`] (services) -> [`proxy`] (the request
//! phases and one module per endpoint) -> [`rules`] (the queue's arithmetic) -> [`store`] (Redis
//! and the scripts in `lua/`).

pub mod admission;
pub mod admin;
pub mod claims;
pub mod cli;
pub mod config;
pub mod control;
pub mod event;
pub mod health;
pub mod hold;
pub mod http1;
pub mod identity;
pub mod lifecycle;
pub mod limits;
pub mod line;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod page;
pub mod paths;
pub mod periodic;
pub mod policy;
pub mod proxy;
pub mod rules;
pub mod server;
pub mod spent;
pub mod state;
pub mod store;
