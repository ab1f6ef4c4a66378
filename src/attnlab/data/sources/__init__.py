"""The sources of one's own files (``folder``, ``file``, ``files``, ``text``), each registered by name; reached
through :func:`~attnlab.data.source.get_source`, never imported by a task."""
