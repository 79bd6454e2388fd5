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
