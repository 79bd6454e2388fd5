-- POST /oauth/token/introspect with client_secret_basic, a random live token each time.
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
local tokens = read_lines(os.getenv("BENCH_DIR") .. "/access.txt")
form_post()
request = function()
  return wrk.format(nil, "/oauth/token/introspect", nil, "token=" .. tokens[math.random(#tokens)])
end
response = function(status) count_status(status) end
