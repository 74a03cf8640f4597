-- POST {prefix}/enter for a user never seen before on every request: n<WR_TAG>-<thread>-<count>.
local tag = os.getenv("WR_TAG") or "x"
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function init(args)
  count = 0
  prefix = "n" .. tag .. "-" .. (id or 1) .. "-"
end

function request()
  count = count + 1
  return wrk.format("POST", "/queue/enter", { ["X-User-Id"] = prefix .. count }, "")
end
