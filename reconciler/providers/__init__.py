"""Provider adapters: execute a call at a real provider and look its effect up again
through the provider's official SDK (each an optional extra: ``effectq[stripe]``,
``effectq[postmark]``, ``effectq[twilio]``). ``base`` holds what every adapter decides."""
