// Unit tests of the waiting page's polling logic (assets/poll.mjs), with node's built-in runner:
//   node --test tests/page/poll.test.mjs
// tests/page.rs runs this file so `cargo test` covers it.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  STATES,
  clock,
  continueHref,
  etaText,
  fill,
  nextCall,
  nextDelay,
  opensInSeconds,
  parseRetryAfter,
  progressPercent,
  stateOf,
} from "../../assets/poll.mjs";

const waiting = (pollAfter, position = 4, estimatedWaitTime = 4) => ({
  httpStatus: 200,
  retryAfter: null,
  body: { status: "WAITING", position, estimatedWaitTime, pollAfter },
});
const ready = { httpStatus: 200, retryAfter: null, body: { status: "READY", token: "t", expiresIn: 300, pollAfter: null } };
const notInQueue = { httpStatus: 200, retryAfter: null, body: { status: "NOT_IN_QUEUE", pollAfter: null } };
const refused = (status, retryAfter, header = retryAfter) => ({
  httpStatus: 429,
  retryAfter: header,
  body: { status, retryAfter },
});
const unavailable = (retryAfter) => ({ httpStatus: 503, retryAfter, body: { error: "redis unavailable" } });
const noAnswer = { httpStatus: 0, retryAfter: null, body: {} };
const beforeOpening = (status, opensIn, pollAfter) => ({ httpStatus: 200, retryAfter: null, body: { status, opensIn, pollAfter } });
const closed = { httpStatus: 200, retryAfter: null, body: { status: "CLOSED", pollAfter: null } };
const unauthenticated = { httpStatus: 401, retryAfter: null, body: { error: "missing identity" } };

// Random numbers across [0, 1), the range Math.random() returns.
const RANDOMS = [0, 0.001, 0.25, 0.5, 0.75, 0.999, 0.9999999];

function assertWithin(ms, seconds) {
  assert.ok(ms >= seconds * 1000, `${ms} ms is sooner than the ${seconds} s told`);
  assert.ok(ms <= seconds * 1100, `${ms} ms is more than 10 % later than the ${seconds} s told`);
}

test("WAITING: pollAfter seconds, plus up to 10 % jitter, never sooner", () => {
  for (const pollAfter of [2, 5, 10, 60]) {
    for (const r of RANDOMS) assertWithin(nextDelay(waiting(pollAfter), r), pollAfter);
    assert.equal(nextDelay(waiting(pollAfter), 0), pollAfter * 1000, "no jitter at random 0");
  }
});

test("WAITING with pollAfter 0: the next status at once (the proxy holds it), anything else never sooner than 1 s", () => {
  for (const r of RANDOMS) assert.equal(nextDelay(waiting(0), r), 0);
  assert.equal(nextCall(waiting(0), "status"), "status");
  const fullAtZero = { httpStatus: 429, body: { status: "FULL", retryAfter: 0 }, retryAfter: 0 };
  for (const r of RANDOMS) assert.ok(nextDelay(fullAtZero, r) >= 1000, "a 0 elsewhere is no hot loop");
});

test("the jitter spreads pages out instead of moving them in lockstep", () => {
  const delays = new Set(RANDOMS.map((r) => nextDelay(waiting(10), r)));
  assert.ok(delays.size >= 5, `only ${delays.size} distinct delays`);
  const low = nextDelay(waiting(10), 0.1);
  const high = nextDelay(waiting(10), 0.9);
  assert.ok(high > low, "more random, later call");
  assert.ok(high - low >= 700, "the jitter is proportional: 8 % of 10 s");
});

test("READY and NOT_IN_QUEUE stop polling (pollAfter null)", () => {
  for (const r of RANDOMS) {
    assert.equal(nextDelay(ready, r), null);
    assert.equal(nextDelay(notInQueue, r), null);
  }
  assert.equal(nextCall(ready, "status"), null);
  assert.equal(nextCall(ready, "enter"), null);
  assert.equal(nextCall(notInQueue, "status"), null);
});

test("503: waits Retry-After and repeats the call that failed", () => {
  for (const r of RANDOMS) assertWithin(nextDelay(unavailable(30), r), 30);
  assertWithin(nextDelay(unavailable(7), 0.5), 7);
  assert.equal(stateOf(unavailable(30)), "UNAVAILABLE");
  assert.equal(nextCall(unavailable(30), "enter"), "enter", "not known to be in line yet");
  assert.equal(nextCall(unavailable(30), "status"), "status");
});

test("429 FULL: waits retryAfter, then enters again", () => {
  for (const r of RANDOMS) assertWithin(nextDelay(refused("FULL", 30), r), 30);
  assert.equal(stateOf(refused("FULL", 30)), "FULL");
  assert.equal(nextCall(refused("FULL", 30), "enter"), "enter");
});

test("429 TOO_EARLY: waits retryAfter, then polls status again", () => {
  for (const r of RANDOMS) assertWithin(nextDelay(refused("TOO_EARLY", 2), r), 2);
  assert.equal(stateOf(refused("TOO_EARLY", 2)), "TOO_EARLY");
  assert.equal(nextCall(refused("TOO_EARLY", 2), "status"), "status");
});

test("429 LIMITED: waits retryAfter, then enters again", () => {
  for (const r of RANDOMS) assertWithin(nextDelay(refused("LIMITED", 41), r), 41);
  assert.equal(stateOf(refused("LIMITED", 41)), "LIMITED");
  assert.equal(nextCall(refused("LIMITED", 41), "enter"), "enter");
});

test("401: SIGN_IN, not UNAVAILABLE, and no more calls until the user signs in and reloads", () => {
  for (const body of [{ error: "missing identity" }, {}, { status: "WAITING", position: 1 }]) {
    const answer = { httpStatus: 401, retryAfter: null, body };
    assert.equal(stateOf(answer), "SIGN_IN");
    for (const r of RANDOMS) assert.equal(nextDelay(answer, r), null);
    assert.equal(nextCall(answer, "enter"), null);
    assert.equal(nextCall(answer, "status"), null);
  }
  assert.equal(stateOf({ httpStatus: 403, retryAfter: null, body: {} }), "UNAVAILABLE", "only a 401 asks to sign in");
});

test("429: the Retry-After header counts when the body has no retryAfter", () => {
  assertWithin(nextDelay(refused("FULL", undefined, 12), 0.3), 12);
});

test("no answer or an unexpected one: UNAVAILABLE, a fallback wait, the same call again", () => {
  for (const answer of [noAnswer, { httpStatus: 502, retryAfter: null, body: {} }, unavailable(null)]) {
    assert.equal(stateOf(answer), "UNAVAILABLE");
    const delay = nextDelay(answer, 0.5);
    assert.ok(delay >= 1000 && delay <= 60_000, `fallback ${delay} ms`);
    assert.equal(nextCall(answer, "status"), "status");
  }
  assert.equal(stateOf({ httpStatus: 200, retryAfter: null, body: { status: "SOMETHING" } }), "UNAVAILABLE");
});

test("a zero or missing wait never turns into a hot loop", () => {
  // WAITING's pollAfter 0 is the exception above: the proxy holds the poll that follows it.
  assert.ok(nextDelay(unavailable(0), 0) >= 1000);
  assert.ok(nextDelay(waiting(undefined), 0) >= 1000);
  assert.ok(nextDelay(waiting(-5), 0) >= 1000);
});

test("every state is one of the contract's", () => {
  const answers = [
    waiting(2), ready, notInQueue, refused("FULL", 1), refused("TOO_EARLY", 1), refused("LIMITED", 1), unavailable(1), noAnswer,
    beforeOpening("NOT_OPEN", 90, 10), beforeOpening("PREQUEUED", 3, 2), closed, unauthenticated,
  ];
  assert.deepEqual(new Set(answers.map(stateOf)), new Set(STATES));
  assert.equal(nextCall(waiting(2), "enter"), "status");
});

test("a scheduled event: NOT_OPEN enters again, PREQUEUED polls status, both as told; CLOSED stops", () => {
  for (const r of RANDOMS) {
    assertWithin(nextDelay(beforeOpening("NOT_OPEN", 90, 10), r), 10);
    assertWithin(nextDelay(beforeOpening("PREQUEUED", 3, 2), r), 2);
    assert.equal(nextDelay(closed, r), null);
  }
  assert.equal(nextCall(beforeOpening("NOT_OPEN", 90, 10), "enter"), "enter", "NOT_OPEN queued nobody");
  assert.equal(nextCall(beforeOpening("PREQUEUED", 3, 2), "enter"), "status");
  assert.equal(nextCall(beforeOpening("PREQUEUED", 3, 2), "status"), "status");
  assert.equal(nextCall(closed, "status"), null);
  assert.equal(stateOf({ ...closed, httpStatus: 503 }), "UNAVAILABLE", "only a 200 CLOSED is the close");
});

test("the countdown to the opening: whole seconds left, rounded up, never below 0", () => {
  const at = Date.parse("2026-12-24T09:59:00Z");
  assert.equal(opensInSeconds(60, at, at), 60);
  assert.equal(opensInSeconds(60, at, at + 1), 60, "rounded up");
  assert.equal(opensInSeconds(60, at, at + 1000), 59);
  assert.equal(opensInSeconds(60, at, at + 61_000), 0);
  assert.equal(opensInSeconds(undefined, at, at), null);
  assert.equal(opensInSeconds(-1, at, at), null);
});

test("Retry-After: seconds or an HTTP-date", () => {
  const now = Date.parse("2025-01-01T00:00:00Z");
  assert.equal(parseRetryAfter("30", now), 30);
  assert.equal(parseRetryAfter(" 0 ", now), 0);
  assert.equal(parseRetryAfter("Wed, 01 Jan 2025 00:00:45 GMT", now), 45);
  assert.equal(parseRetryAfter("Tue, 31 Dec 2024 23:00:00 GMT", now), 0, "a date in the past");
  assert.equal(parseRetryAfter(null, now), null);
  assert.equal(parseRetryAfter("soon", now), null);
  assert.equal(parseRetryAfter("-3", now), null);
});

test("progress: the share of the line ahead at entry that has been admitted", () => {
  assert.equal(progressPercent(4, 4), 0);
  assert.equal(progressPercent(4, 3), 25);
  assert.equal(progressPercent(4, 1), 75);
  assert.equal(progressPercent(1000, 1), 100);
  assert.equal(progressPercent(1, 1), 0);
  assert.equal(progressPercent(null, 3), 0);
  assert.equal(progressPercent(3, 5), 0, "never negative");
});

const en = {
  eta_soon: "any moment now",
  eta_under_minute: "less than a minute",
  eta_minute: "about 1 minute",
  eta_minutes: "about {n} minutes",
  eta_hour: "about 1 hour",
  eta_hours: "about {n} hours",
  eta_paused: "unknown: admission is paused",
};

test("the estimated wait in words", () => {
  assert.equal(etaText(0, en), "any moment now");
  assert.equal(etaText(4, en), "less than a minute");
  assert.equal(etaText(59, en), "less than a minute");
  assert.equal(etaText(60, en), "about 1 minute");
  assert.equal(etaText(89, en), "about 1 minute");
  assert.equal(etaText(120, en), "about 2 minutes");
  assert.equal(etaText(59 * 60, en), "about 59 minutes");
  assert.equal(etaText(3600, en), "about 1 hour");
  assert.equal(etaText(3 * 3600 + 600, en), "about 3 hours");
  // A paused room's null estimate is no "any moment now" (contract section 15).
  assert.equal(etaText(null, en), "unknown: admission is paused");
});

test("clock, fill, continue link", () => {
  assert.equal(clock(300), "5:00");
  assert.equal(clock(299.2), "5:00", "rounded up, like expiresIn");
  assert.equal(clock(61), "1:01");
  assert.equal(clock(-4), "0:00");
  assert.equal(clock(3725), "1:02:05");
  assert.equal(fill("number {position}, {eta}", { position: 3, eta: "soon" }), "number 3, soon");
  assert.equal(fill("{unknown}", {}), "{unknown}");
  const token = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
  assert.equal(continueHref("/checkout", token), `/checkout#entry_token=${token}`);
  assert.equal(continueHref("https://shop.example/pay?x=1#old", token), `https://shop.example/pay?x=1#entry_token=${token}`);
});
