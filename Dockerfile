# Image for the MLflow server and the workers of docker-compose.yml (not built on this project's CI).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY platform ./platform
RUN pip install --no-cache-dir -c constraints.txt -e ".[postgres,auth]"
COPY experiments ./experiments
COPY studies ./studies
