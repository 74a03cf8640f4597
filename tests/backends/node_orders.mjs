// An order API as a shop would write it on Node's own `http` module, for the tests that put the
// room in front of a backend of another framework (tests/other_frameworks.rs, started by
// tests/common/node_backend.rs). No npm packages: Node 18 or newer is all it needs.
//
// It routes the way Node documents for `req.url`, `new URL(req.url, 'http://' + req.headers.host)`,
// so it reads `//shop/api/orders` as the host `shop` and the path `/api/orders`, an order. And it
// finishes every order whose body it has read, whether or not its client is still there (as Flask,
// Django or an Express handler without an abort check do): an order the proxy let through is an
// order placed.
//
//   node node_orders.mjs [PORT]   PORT (or env PORT): where to listen on 127.0.0.1; 0, the default,
//                                 picks a free port. The first line on stdout is the port bound.
//   env DELAY_MS=300              every order takes this long (the test's choice, not a client's)
//
//   POST /api/orders   201 {"orderId": n}; records the user (X-User-Id), the token
//                      (X-Entry-Token), the method and the raw request target
//   GET /admin/orders  200 {"orders": [...], "inProgress": n, "requests": [...]}: the orders placed,
//                      those still being processed, and every other request's method and target
//   anything else      404 {"error": "not found"}, recorded in `requests`

import http from 'node:http';

const port = Number(process.argv[2] ?? process.env.PORT ?? 0);
const delayMs = Number(process.env.DELAY_MS ?? 0);
if (!Number.isInteger(port) || port < 0 || !Number.isFinite(delayMs) || delayMs < 0) {
  console.error('usage: node node_orders.mjs [PORT], env DELAY_MS=<ms>');
  process.exit(2);
}

const orders = [];
const requests = [];
let inProgress = 0;

function reply(res, status, body) {
  const bytes = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(bytes) });
  res.end(bytes);
}

function placeOrder(req, res) {
  // Taken now: the request object says nothing useful once its client has gone.
  const order = {
    user: req.headers['x-user-id'] ?? null,
    token: req.headers['x-entry-token'] ?? null,
    method: req.method,
    url: req.url,
  };
  req.resume();
  req.on('end', () => {
    // The whole body is here: from now on the order is processed, connection or not.
    inProgress += 1;
    setTimeout(() => {
      inProgress -= 1;
      order.orderId = orders.length + 1;
      orders.push(order);
      reply(res, 201, { orderId: order.orderId });
    }, delayMs);
  });
}

const server = http.createServer((req, res) => {
  // A client gone before its answer makes writing it fail; the order stands all the same.
  res.on('error', () => {});
  let url;
  try {
    url = new URL(req.url, `http://${req.headers.host ?? 'localhost'}`);
  } catch {
    requests.push({ method: req.method, url: req.url });
    req.resume();
    reply(res, 400, { error: 'invalid URL' });
    return;
  }
  if (req.method === 'GET' && url.pathname === '/admin/orders') {
    reply(res, 200, { orders, inProgress, requests });
  } else if (req.method === 'POST' && url.pathname === '/api/orders') {
    placeOrder(req, res);
  } else {
    requests.push({ method: req.method, url: req.url });
    req.resume();
    reply(res, 404, { error: 'not found' });
  }
});
// The proxy pools its upstream connections: an idle one closed by Node's keep-alive timeout (5 s
// by default) under a request the proxy sends on it would be a spurious 502.
server.keepAliveTimeout = 0;
server.requestTimeout = 0;
server.listen(port, '127.0.0.1', () => {
  console.log(server.address().port);
});
