dofile(os.getenv("BENCH_LUA") .. "/common.lua")
response = function(status) count_status(status) end
