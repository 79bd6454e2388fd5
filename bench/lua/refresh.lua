-- POST /oauth/token/refresh with rotation: every connection runs its own chain, taking the
-- refresh token each response returns for its next request.
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
local ready = {}
form_post()
function init(args) ready = thread_pool("refresh") end
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
