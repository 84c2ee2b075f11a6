# One image for the toolfleet worker, the dispatcher CLI and Flower.
FROM python:3.11-slim
# bubblewrap: run_command's sandbox (docs/sandbox.md)
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 toolfleet
WORKDIR /app
COPY pyproject.toml README.md ./
COPY toolfleet ./toolfleet
# the mcp extra: workers may host MCP servers (`toolfleet worker --mcp NAME=COMMAND`)
RUN pip install --no-cache-dir ".[mcp]"
USER toolfleet
WORKDIR /workspace
ENTRYPOINT ["toolfleet"]
CMD ["worker", "--concurrency", "2"]
