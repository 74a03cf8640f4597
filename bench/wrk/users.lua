-- One request per call for a user picked at random among the WR_QUEUE waiting users u1..uN
-- (a pool of WR_POOL prebuilt requests per thread, cycled, so that the generator stays cheap).
-- WR_METHOD / WR_PATH: GET /queue/status (default) or POST /queue/enter (a re-enter).
local n = tonumber(os.getenv("WR_QUEUE") or "100000")
local pool_size = tonumber(os.getenv("WR_POOL") or "10000")
local method = os.getenv("WR_METHOD") or "GET"
local path = os.getenv("WR_PATH") or "/queue/status"

function init(args)
  math.randomseed(7919 * (id or 1))
  pool = {}
  local body = nil
  if method == "POST" then body = "" end
  for i = 1, pool_size do
    pool[i] = wrk.format(method, path, { ["X-User-Id"] = "u" .. math.random(1, n) }, body)
  end
  idx = 0
end

function request()
  idx = idx % pool_size + 1
  return pool[idx]
end
