#include <ucp/api/ucp.h>
/* ucs_global_opts: the log level, to quiet an expected error of endpoint creation. */
#include <ucs/config/global_opts.h>
