-- A protected request (GET /echo/protected, configured as protected in the bench's room) with a
-- valid entry token, each (user, token) pair from WR_PAIRS used once: thread k of WR_THREADS takes
-- every k-th line. The echo answers 200, so the proxy checks the token, forwards, and spends it.
-- Running out of pairs wraps around: spent tokens then answer 403 and show up as non-2xx.
local file = os.getenv("WR_PAIRS")
local path = os.getenv("WR_PATH") or "/echo/protected"

function init(args)
  local nth = tonumber(os.getenv("WR_THREADS") or "2")
  local me = (id or 1) - 1
  reqs = {}
  local i = 0
  for line in io.lines(file) do
    if i % nth == me then
      local u, t = line:match("^(%S+) (%S+)$")
      reqs[#reqs + 1] = wrk.format("GET", path, { ["X-User-Id"] = u, ["X-Entry-Token"] = t })
    end
    i = i + 1
  end
  idx = 0
end

function request()
  idx = idx + 1
  if idx > #reqs then idx = 1 end
  return reqs[idx]
end
