"""Libraries every app may use, that use no app: ids, environment parsing, signatures,
the SSRF address checks, plain INSERTs. The bottom layer (docs/ARCHITECTURE.md)."""
