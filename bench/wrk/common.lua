-- Appended to every script by bench/run.sh: numbers wrk's threads (each script's init() reads its
-- own as `id`, 1..WR_THREADS, to pick its share of users or tokens), and writes one
-- machine-readable line per wrk run.
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

done = function(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_s":%.3f,"rps":%.1f,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f,"errors":%d,"non2xx":%d}\n',
    summary.requests, secs, summary.requests / secs,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    e.connect + e.read + e.write + e.timeout, e.status))
end
