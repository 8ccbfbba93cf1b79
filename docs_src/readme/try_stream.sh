curl -N -X POST localhost:8000/generate
