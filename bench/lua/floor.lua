-- POST /floor on the hello-world process: a form post answered with a small JSON body.
dofile(os.getenv("BENCH_LUA") .. "/common.lua")
form_post()
wrk.body = "token=abcdefghijklmnopqrstuvwxyzabcdefghijklmnopq"
response = function(status) count_status(status) end
