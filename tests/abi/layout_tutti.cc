// The layout table as tutti's include/nccl.h defines it.
#include <nccl.h>

#ifndef TUTTI_NCCL_H
#error "layout_tutti.cc resolved <nccl.h> to a header that is not tutti's"
#endif

#include "layout_table.h"

// After the header: the facts are evaluated against it.
#include "layout_fill.inc"

LayoutTable tuttiLayout() { return fillLayout(); }
