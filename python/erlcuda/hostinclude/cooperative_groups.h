// erlcuda: cooperative groups need a block's threads to run together, which the cpu backend
// does not do. This stand-in lets a source that includes the header be preprocessed; one
// that uses the groups is refused then, with the reason, before it is compiled.
#ifndef ERLCUDA_COOPERATIVE_GROUPS_H
#define ERLCUDA_COOPERATIVE_GROUPS_H
namespace cooperative_groups {}
#endif
