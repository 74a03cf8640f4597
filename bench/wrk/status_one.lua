-- GET {prefix}/status for one waiting user (WR_USER), the same request every time.
wrk.method = "GET"
wrk.path = "/queue/status"
wrk.headers["X-User-Id"] = os.getenv("WR_USER") or "u50000"
