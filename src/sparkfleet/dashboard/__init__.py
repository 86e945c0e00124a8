"""The web dashboard: read models over the state store (data), the ASGI app (app), the doctor
history it shows (doctor_history). Importing this package pulls in neither Starlette nor uvicorn."""
