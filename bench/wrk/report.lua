-- Appended to every script by bench/run.sh: one machine-readable line per wrk run.
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
