"""The core's built-in plugins. All but :mod:`loop_defaults` are registered through the core
distribution's entry points, exactly as third-party plugins are."""
