/* placeholder: filled in by the npz module */
#ifndef CTRAIN_NPZ_H
#define CTRAIN_NPZ_H
#endif
