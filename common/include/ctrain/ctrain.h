/* ctrain: the umbrella header of the core library. */
#ifndef CTRAIN_CTRAIN_H
#define CTRAIN_CTRAIN_H

#include "ctrain/backend.h"
#include "ctrain/data.h"
#include "ctrain/function.h"
#include "ctrain/graph.h"
#include "ctrain/job.h"
#include "ctrain/nn.h"
#include "ctrain/ops.h"
#include "ctrain/optim.h"
#include "ctrain/profile.h"
#include "ctrain/rng.h"
#include "ctrain/status.h"
#include "ctrain/tensor.h"
#include "ctrain/train.h"

#endif
