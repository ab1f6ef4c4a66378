"""The file extensions read as images (any case), by the image folder scan and by
:func:`attnlab.data.paths.folder_contents`; a module of its own, with no import, so that
both can import it at their top."""

__all__ = ["IMG_EXTENSIONS"]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
