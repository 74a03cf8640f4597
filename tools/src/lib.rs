//! waitroom seen from outside: the tools that stand around the proxy in the demo, the tests and
//! the benchmark, none of which shares code with the proxy itself.
//!
//! - [`demo_api`]: the demo order API, a slot-limited backend and an echo (binary `demo-order-api`);
//! - [`identity_front`]: the authentication layer in front of the proxy, for a developer's machine
//!   (binary `identity-front`), so the waiting page can be opened in a browser;
//! - [`room`]: a room's endpoints as a client calls them;
//! - [`crowd`]: simulated users who enter, poll as told and order, used by the demo's `crowd`
//!   binary and by the benchmark's `wrbench crowd`;
//! - [`numbers`]: the seeded generator and percentiles both crowds use;
//! - [`service`]: the process around the binaries (logging, runtime, exit code) and the accept loop.

pub mod crowd;
pub mod demo_api;
pub mod identity_front;
pub mod numbers;
pub mod room;
pub mod service;
