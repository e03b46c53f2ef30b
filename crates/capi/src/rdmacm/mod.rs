//! librdmacm (`rdma_*`) over softrdma, owned by the rdmacm engineer.
//!
//! Exported from libibverbs.so.1 under private names (`softrdma_rdma_*`,
//! version node `SOFTRDMA_PRIVATE_1`, listed in `exports.txt`) that the
//! thin `librdmacm.so.1` (crate `softrdma-capi-rdmacm`) forwards to, so
//! rdma_cm shares this library's one engine and its verbs objects. See
//! `ARCHITECTURE.md` for the internal API ([`crate::objects`],
//! [`crate::verbs_api`]) to build on.
