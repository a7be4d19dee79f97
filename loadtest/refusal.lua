-- One order request as a buyer sends it, repeated: POST with a bearer token, an idempotency
-- key and a JSON body. The token comes from FLASHGATE_WRK_TOKEN (`flashgate token --user …`).
wrk.method = "POST"
wrk.body = '{"quantity":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("FLASHGATE_WRK_TOKEN") or "")
wrk.headers["Idempotency-Key"] = "wrk-refusal-0001"
