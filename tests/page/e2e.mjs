// End-to-end run of the waiting page in headless Chromium against a running proxy.
//
//   node tests/page/e2e.mjs <proxy base url> <artifact dir> [--prefix /queue] [--fill 5]
//        [--ready-url /checkout] [--token-header X-Entry-Token] [--user page-user]
//        [--no-identity --fill-base <proxy url>]
//
// tests/page.rs starts Redis, the demo order API and a slowly admitting proxy, then runs this.
// The script enters `--fill` other users just before the page loads (so the page's user starts a
// few places back, whatever the browser's start-up took), then checks what a shopper would see:
// WAITING with a position, the position falling, READY with the continue link carrying the token
// in its fragment and sessionStorage holding it; then it follows the link by keyboard and does
// what docs/front-end-handoff.md tells the shop's front end to do (token from the fragment, sent
// in the token header with the order). Screenshots of WAITING and READY go to the artifact dir.
// The last line on stdout is a JSON summary that tests/page.rs checks.
//
// The browser context sends X-User-Id on every request: it stands in for the authentication
// layer that, in trusted-header mode, sits in front of the proxy. With `--no-identity` it sends
// none: the base URL is then something that plays that layer itself (tools' identity-front, with
// its cookie), the fillers enter at `--fill-base` (the proxy itself) as themselves, and the summary
// names the user the cookie gave the browser (`cookieUser`).
//
// Chromium: see browser.mjs.

import { join } from "node:path";
import { runInChromium } from "./browser.mjs";
import { parseArgs } from "node:util";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    prefix: { type: "string", default: "/queue" },
    fill: { type: "string", default: "5" },
    "ready-url": { type: "string", default: "/checkout" },
    "token-header": { type: "string", default: "X-Entry-Token" },
    user: { type: "string", default: "page-user" },
    "no-identity": { type: "boolean", default: false },
    "fill-base": { type: "string" },
  },
});
const [base, artifacts] = positionals;
if (!base || !artifacts) {
  console.error("usage: node e2e.mjs <proxy base url> <artifact dir> [--prefix P] [--fill N] ...");
  process.exit(2);
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const OVERALL_TIMEOUT_MS = 60_000;

const hookText = (name) => `document.querySelector('[data-waitroom="${name}"]').textContent`;

function check(condition, message) {
  if (!condition) throw new Error(message);
}

function log(message) {
  console.log(`[e2e ${new Date().toISOString().slice(11, 23)}] ${message}`);
}

async function enterFillers(count) {
  for (let i = 1; i <= count; i++) {
    const res = await fetch(`${opts["fill-base"] ?? base}${opts.prefix}/enter`, { method: "POST", headers: { "X-User-Id": `e2e-filler-${i}` } });
    const body = await res.json();
    check(res.status === 200 && body.status === "WAITING", `filler ${i}: ${res.status} ${JSON.stringify(body)}`);
  }
}

async function run(context) {
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  // Chromium also logs every non-2xx fetch as a console error; those are answers, not bugs.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) pageErrors.push(m.text());
  });

  await enterFillers(Number(opts.fill));
  log(`entered ${opts.fill} other users; opening ${base}${opts.prefix}/`);
  const response = await page.goto(`${base}${opts.prefix}/`);
  check(response.status() === 200, `page: HTTP ${response.status()}`);
  check(response.headers()["content-type"].startsWith("text/html"), `page: ${response.headers()["content-type"]}`);
  check((await page.getAttribute("html", "lang")) === "en", "lang is not en");
  check(await page.locator('[data-waitroom="continue"]').isHidden(), "continue link visible before READY");

  // WAITING, with a position in digits.
  await page.waitForFunction(`${hookText("state")} === "WAITING"`, null, { timeout: 10_000 });
  const first = await page.evaluate(() => ({
    position: document.querySelector('[data-waitroom="position"]').textContent,
    eta: document.querySelector('[data-waitroom="eta"]').textContent,
    progressTag: document.querySelector('[data-waitroom="progress"]').tagName,
    announced: document.querySelector('[data-waitroom="announce"]').textContent,
    updated: document.querySelector('[data-waitroom="updated"]').textContent,
  }));
  log(`WAITING at position ${first.position}, eta "${first.eta}"`);
  check(/^\d+$/.test(first.position), `position is not digits: ${JSON.stringify(first.position)}`);
  const startPosition = Number(first.position);
  check(startPosition >= 2, `the page started at position ${startPosition}: too close to see it fall`);
  check(first.eta.trim() !== "", "no estimated wait");
  check(first.progressTag === "PROGRESS", `progress hook is a ${first.progressTag}`);
  check(first.announced.includes(first.position), `live region does not announce the position: ${first.announced}`);
  check(first.updated.trim() !== "", "no last-updated time");
  const positions = [startPosition];

  // The position falls as admission runs, and the progress bar moves.
  await page.waitForFunction(
    (start) =>
      document.querySelector('[data-waitroom="state"]').textContent === "WAITING" &&
      Number(document.querySelector('[data-waitroom="position"]').textContent) < start,
    startPosition,
    { timeout: 15_000 },
  );
  const later = await page.evaluate(() => ({
    position: Number(document.querySelector('[data-waitroom="position"]').textContent),
    progress: document.querySelector('[data-waitroom="progress"]').value,
  }));
  positions.push(later.position);
  log(`position fell to ${later.position}, progress ${later.progress} %`);
  check(later.progress > 0, "the progress bar did not move");
  await page.screenshot({ path: join(artifacts, "waiting.png"), animations: "disabled" });

  // READY: the hand-off link and sessionStorage carry the token.
  await page.waitForFunction(`${hookText("state")} === "READY"`, null, { timeout: 20_000 });
  const link = page.locator('[data-waitroom="continue"]');
  await link.waitFor({ state: "visible", timeout: 2_000 });
  const href = await link.getAttribute("href");
  const stored = await page.evaluate(() => sessionStorage.getItem("waitroom.token"));
  log(`READY, continue link ${href}`);
  check(UUID.test(stored ?? ""), `sessionStorage waitroom.token is not a UUID: ${stored}`);
  check(href === `${opts["ready-url"]}#entry_token=${stored}`, `continue href ${href} does not carry the stored token`);
  const expires = await page.evaluate(() => document.querySelector('[data-waitroom="expires"]').textContent);
  check(/\d:\d\d/.test(expires), `no pass countdown: ${expires}`);
  await page.screenshot({ path: join(artifacts, "ready.png"), animations: "disabled" });

  // Keyboard: the continue link is the first stop of the tab order, Enter follows it.
  await page.keyboard.press("Tab");
  const focused = await page.evaluate(() => document.activeElement?.getAttribute("data-waitroom"));
  check(focused === "continue", `Tab focused ${focused}, not the continue link`);
  await Promise.all([page.waitForURL((url) => url.pathname === opts["ready-url"]), page.keyboard.press("Enter")]);

  // The shop's page: what docs/front-end-handoff.md says, verbatim in spirit.
  const shop = await page.evaluate(async (tokenHeader) => {
    const echoed = document.body.innerText; // the demo API echoes the request it got for the page
    const fromFragment = new URLSearchParams(location.hash.slice(1)).get("entry_token");
    const token = fromFragment ?? sessionStorage.getItem("waitroom.token");
    history.replaceState(history.state, "", location.pathname + location.search);
    const res = await fetch("/api/orders", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", [tokenHeader]: token },
      body: JSON.stringify({ item: "widget", quantity: 1 }),
    });
    return { fromFragment, token, orderStatus: res.status, order: await res.text(), hashAfter: location.hash, echoed };
  }, opts["token-header"]);
  log(`order with the token from the fragment: HTTP ${shop.orderStatus} ${shop.order}`);
  check(shop.fromFragment === stored, `fragment token ${shop.fromFragment} != stored ${stored}`);
  check(shop.hashAfter === "", `the fragment was not removed: ${shop.hashAfter}`);
  check(!shop.echoed.includes(stored), "the token reached the server with the page request");
  check(pageErrors.length === 0, `errors in the page: ${pageErrors.join("; ")}`);
  const cookieUser = (await context.cookies()).find((c) => c.name === "waitroom_dev_user")?.value ?? null;
  return { result: "ok", positions, token: stored, orderStatus: shop.orderStatus, order: shop.order, cookieUser };
}

await runInChromium({
  name: "e2e",
  artifacts,
  failureShot: "failure.png",
  timeoutMs: OVERALL_TIMEOUT_MS,
  contextOptions: {
    viewport: { width: 390, height: 844 },
    deviceScaleFactor: 2,
    colorScheme: "light",
    extraHTTPHeaders: opts["no-identity"] ? {} : { "X-User-Id": opts.user },
  },
  run,
});
