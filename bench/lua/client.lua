-- GET /oauth/clients/{id}
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
request = function() return wrk.format("GET", "/oauth/clients/bench") end
response = function(status) count_status(status) end
