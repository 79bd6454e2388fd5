-- POST /oauth/token: each request spends a fresh code from this thread's slice of the pool.
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
local codes = nil
local next_code = 1
local body_tail = "&redirect_uri=http%3A%2F%2F127.0.0.1%3A1%2Fcb&code_verifier=" .. os.getenv("BENCH_VERIFIER")
form_post()
function init(args) codes = thread_pool("codes") end
request = function()
  local code = codes[next_code]
  next_code = next_code + 1
  if code == nil then code = "pool-exhausted" end
  return wrk.format(nil, "/oauth/token", nil, "grant_type=authorization_code&code=" .. code .. body_tail)
end
response = function(status) count_status(status) end
