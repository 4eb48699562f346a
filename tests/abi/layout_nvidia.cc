// The layout table as NVIDIA's own nccl.h defines it. This is the only source
// file of tutti's tree compiled with NVIDIA's include directory.
#include <nccl.h>

#ifdef TUTTI_NCCL_H
#error "layout_nvidia.cc resolved <nccl.h> to tutti's header; NVIDIA's is needed here"
#endif

#include "layout_table.h"

// After the header: the facts are evaluated against it.
#include "layout_fill.inc"

LayoutTable nvidiaLayout() { return fillLayout(); }
