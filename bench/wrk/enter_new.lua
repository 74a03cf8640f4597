-- POST {prefix}/enter for a user never seen before on every request: n<WR_TAG>-<thread>-<count>.
local tag = os.getenv("WR_TAG") or "x"

function init(args)
  count = 0
  prefix = "n" .. tag .. "-" .. (id or 1) .. "-"
end

function request()
  count = count + 1
  return wrk.format("POST", "/queue/enter", { ["X-User-Id"] = prefix .. count }, "")
end
