-- GET /v1/me with a random live bearer token.
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
local tokens = read_lines(os.getenv("BENCH_DIR") .. "/access.txt")
request = function()
  return wrk.format("GET", "/v1/me", {["Authorization"] = "Bearer " .. tokens[math.random(#tokens)]})
end
response = function(status) count_status(status) end
