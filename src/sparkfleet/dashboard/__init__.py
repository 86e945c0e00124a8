"""The web dashboard: read models over the state store (data) and the ASGI app (app); the doctor
history it shows is doctor's own (``doctor/history.py``). Importing this package pulls in
neither Starlette nor uvicorn."""
