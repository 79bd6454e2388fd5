-- POST an introspection with client_secret_basic, a random live token each time; an answer
-- that does not say the token is active counts as a failure. BENCH_INTROSPECT_PATH names the
-- endpoint (tokensvc's by default; the peer's is /token/introspection).
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
local tokens = read_lines(os.getenv("BENCH_DIR") .. "/access.txt")
local path = os.getenv("BENCH_INTROSPECT_PATH") or "/oauth/token/introspect"
form_post()
request = function()
  return wrk.format(nil, path, nil, "token=" .. tokens[math.random(#tokens)])
end
response = function(status, headers, body)
  if status == 200 and not string.find(body, '"active":true', 1, true) then status = 599 end
  count_status(status)
end
