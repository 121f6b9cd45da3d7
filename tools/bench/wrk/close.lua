-- As cookies.lua, each request with `Connection: close`: a new connection per request.
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", "/", {["Connection"] = "close", ["Cookie"] = "JSESSIONID=0000benchsession" .. (i % 64) .. ":clone" .. (i % 4) .. "x"})
end
