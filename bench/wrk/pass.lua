-- GET of a path no rule protects: forwarded to the demo API's echo unchanged.
wrk.method = "GET"
wrk.path = "/echo/pass"
