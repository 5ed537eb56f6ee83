"""Signed completion webhooks (Standard Webhooks 1.0): endpoints, the webhook outbox, the
delivery process, signing, the SSRF guard and the retry / breaker policy.
See docs/webhooks.md."""
