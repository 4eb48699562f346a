/* Anchor so the shared libraries have a source of their own; all code comes from tutti_internal. */
int tutti_export_anchor_unused_;
