-- Shared by the benchmark scripts: read one secret per line, and give each wrk thread its
-- own slice so that no two threads ever send the same single-use value.
function read_lines(path)
  local lines = {}
  for line in io.lines(path) do
    if #line > 0 then lines[#lines + 1] = line end
  end
  return lines
end

function slice(lines, index, count)
  local part = {}
  for i = index, #lines, count do part[#part + 1] = lines[i] end
  return part
end

non2xx = 0
function count_status(status)
  if status < 200 or status >= 300 then non2xx = non2xx + 1 end
end

-- Form posts authenticated with the bench client's Basic credentials.
function form_post()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
  wrk.headers["Authorization"] = os.getenv("BENCH_BASIC")
end

-- Number the threads, so that each takes its own slice of a pool of single-use values.
function setup(thread)
  thread:set("thread_index", setup_count or 1)
  setup_count = (setup_count or 1) + 1
end

-- This thread's slice of the pool NAME for the current phase (warm-up or main run).
function thread_pool(name)
  local path = os.getenv("BENCH_DIR") .. "/" .. name .. "-" .. os.getenv("BENCH_PHASE") .. ".txt"
  return slice(read_lines(path), thread_index, tonumber(os.getenv("BENCH_THREADS")))
end
