//! The room in front of a backend of another framework (contract section 12): an order API on
//! Node's own `http` module (`tests/backends/node_orders.mjs`), which routes as Node documents,
//! `new URL(req.url, base)`, and finishes every order whose body it read, whatever its client
//! does meanwhile. What it placed is read back from it, so each test shows what reached a real
//! backend, not what the proxy meant to send.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Admission is quick so tokens come at once; the protected route is the default,
/// `POST /api/orders`.
const QUICK_ROOM: &str = "admission: {interval: 20ms, batch_size: 50}";

/// A proxy with [`QUICK_ROOM`] and `yaml` in front of a Node backend whose orders take `delay`.
async fn node_room(delay: Duration, yaml: &str) -> (RedisServer, NodeBackend, Proxy) {
    let redis = RedisServer::start();
    let node = NodeBackend::start(delay);
    let proxy = Proxy::builder(&redis.url(), node.addr()).yaml(QUICK_ROOM).yaml(yaml).start().await;
    (redis, node, proxy)
}



/// An order as `user`, with no token, with the request line as given.
fn untokened_order(request_line: &str) -> String {
    format!("{request_line}\r\nHost: shop\r\nX-User-Id: alice\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}")
}

#[tokio::test]
async fn a_target_node_reads_as_host_and_path_places_no_order() {
    let (_redis, node, proxy) = node_room(Duration::ZERO, "").await;
    // Node itself takes it for an order: what the proxy must not let through untokened.
    let direct = raw_request(node.addr(), untokened_order("POST //shop/api/orders HTTP/1.1").as_bytes()).await;
    assert_eq!(http_status(&direct), 201, "{direct}");
    assert_eq!(node.orders().await.len(), 1, "{}", node.seen().await);

    let raw = raw_request(proxy.addr(), untokened_order("POST //shop/api/orders HTTP/1.1").as_bytes()).await;
    assert_eq!(http_status(&raw), 400, "{raw}");
    assert_eq!(
        json_body(&raw),
        json!({"error": "the request target is ambiguous: read as //host/path it could name a protected path"})
    );
    let seen = node.seen().await;
    assert_eq!(seen["orders"].as_array().map(Vec::len), Some(1), "no order through the proxy: {seen}");
    assert_eq!(seen["requests"], json!([]), "nothing else reached node: {seen}");
}

#[tokio::test]
async fn an_admitted_order_reaches_node_once() {
    let (_redis, node, proxy) = node_room(Duration::ZERO, "").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let placed = proxy.order("alice", Some(&token)).await;
    assert_eq!(placed.status, 201, "{}", placed.body);
    assert_eq!(placed.json(), json!({"orderId": 1}));
    let again = proxy.order("alice", Some(&token)).await;
    assert_eq!(again.status, 403, "the token was spent: {}", again.body);
    let orders = node.orders().await;
    assert_eq!(
        orders,
        [json!({"user": "alice", "token": token, "method": "POST", "url": "/api/orders", "orderId": 1})],
        "one order, with the identity and the token as sent"
    );
}

/// Node places an order whose client hung up once its body was read: the proxy must hear Node's
/// answer all the same, and spend the token with it. `unknown_outcome: release`, so that only that
/// answer can spend it: a proxy that dropped the order when its client left would release the
/// token, and the repeat would place a second order.
#[tokio::test]
async fn an_order_whose_client_hangs_up_is_placed_once() {
    let (_redis, node, proxy) = node_room(Duration::from_millis(500), "token: {unknown_outcome: release}").await;
    let token = proxy.until_ready("alice", Duration::from_secs(10)).await;
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let order = format!(
        "POST /api/orders HTTP/1.1\r\nHost: shop\r\nX-User-Id: alice\r\nX-Entry-Token: {token}\r\n\
         Content-Length: 2\r\n\r\n{{}}"
    );
    stream.write_all(order.as_bytes()).await.unwrap();
    let at_node = wait_until(Duration::from_secs(5), Duration::from_millis(5), || async {
        node.seen().await["inProgress"] == 1
    });
    assert!(at_node.await, "the order reached node: {}", node.seen().await);
    drop(stream);
    // While the order is out its claim holds (409); once node answered the token is spent (403).
    let repeat = loop {
        let r = proxy.order("alice", Some(&token)).await;
        if r.status != 409 {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(repeat.status, 403, "the repeat with the token: {}", repeat.body);
    assert_eq!(node.orders().await.len(), 1, "{}", node.seen().await);
}

/// Node's parser reads `POST /api/orders  HTTP/1.1` (two spaces) as an order for `/api/orders`;
/// the contract refuses such a request line with 400 (section 12) rather than repair it. The
/// connection loop's request-line check is being changed alongside this test: it shows the
/// outcome at a real backend.
#[tokio::test]
async fn a_request_line_with_two_spaces_places_no_order() {
    let (_redis, node, proxy) = node_room(Duration::ZERO, "").await;
    let direct = raw_request(node.addr(), untokened_order("POST /api/orders  HTTP/1.1").as_bytes()).await;
    assert_eq!(http_status(&direct), 201, "node takes it for an order: {direct}");
    let raw = raw_request(proxy.addr(), untokened_order("POST /api/orders  HTTP/1.1").as_bytes()).await;
    assert_eq!(http_status(&raw), 400, "{raw}");
    let seen = node.seen().await;
    assert_eq!(seen["orders"].as_array().map(Vec::len), Some(1), "no order through the proxy: {seen}");
    assert_eq!(seen["requests"], json!([]), "nothing else reached node: {seen}");
}
