-- Keep-alive requests spread over a route table: REQUESTS, {host, path} pairs that each
-- match a different route (generated with the table, tools/src/bin/bench/routes.rs),
-- sent in turn; formatted once.
local requests = {
{{REQUESTS}}}
local formatted = {}
local i = 0
init = function(args)
  for k, r in ipairs(requests) do
    formatted[k] = wrk.format("GET", r[2], {["Host"] = r[1]})
  end
end
request = function()
  i = i % #formatted + 1
  return formatted[i]
end
