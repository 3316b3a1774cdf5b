#include <criterion/criterion.h>
Test(dispatcher, placeholder) {}
