# One image for the toolfleet worker, the dispatcher CLI and Flower.
FROM python:3.11-slim
RUN useradd --create-home --uid 1000 toolfleet
WORKDIR /app
COPY pyproject.toml README.md ./
COPY toolfleet ./toolfleet
RUN pip install --no-cache-dir .
USER toolfleet
WORKDIR /workspace
ENTRYPOINT ["toolfleet"]
CMD ["worker", "--concurrency", "2"]
