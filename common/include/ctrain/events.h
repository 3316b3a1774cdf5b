/* placeholder: filled in by the events module */
#ifndef CTRAIN_EVENTS_H
#define CTRAIN_EVENTS_H
#endif
