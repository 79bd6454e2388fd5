-- POST /oauth/token/refresh with rotation: every connection runs its own chain, taking the
-- refresh token each response returns for its next request.
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
local ready = {}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
wrk.headers["Authorization"] = os.getenv("BENCH_BASIC")
function setup(thread)
  thread:set("thread_index", setup_count or 1)
  setup_count = (setup_count or 1) + 1
end
function init(args)
  ready = slice(read_lines(os.getenv("BENCH_DIR") .. "/refresh-" .. os.getenv("BENCH_PHASE") .. ".txt"), thread_index, tonumber(os.getenv("BENCH_THREADS")))
end
request = function()
  local token = table.remove(ready)
  if token == nil then token = "chain-pool-exhausted" end
  return wrk.format(nil, "/oauth/token/refresh", nil, "refresh_token=" .. token)
end
response = function(status, headers, body)
  count_status(status)
  local token = string.match(body, '"refresh_token":"([^"]+)"')
  if token then table.insert(ready, 1, token) end
end
