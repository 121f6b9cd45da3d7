-- Keep-alive requests whose JSESSIONID names the four clones in turn (64 sessions).
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", "/", {["Cookie"] = "JSESSIONID=0000benchsession" .. (i % 64) .. ":clone" .. (i % 4) .. "x"})
end
