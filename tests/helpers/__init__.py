"""What tests share: paths and processes, fakes of the Hub, vLLM and S3, files, the browser, the worker."""
