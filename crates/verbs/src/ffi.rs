//! libibverbs, loaded at run time (dlopen) so iblab starts where it is absent: the few
//! entry points and C structures the verbs probe needs, laid out as rdma-core's verbs.h.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

pub const QPS_RESET: u32 = 0;
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
pub const QPS_ERR: u32 = 6;

pub const QPT_RC: u32 = 2;
pub const WR_RDMA_WRITE: u32 = 0;
pub const WR_SEND: u32 = 2;
pub const SEND_SIGNALED: u32 = 2;
pub const ACCESS_LOCAL_WRITE: c_int = 1;
pub const ACCESS_REMOTE_WRITE: c_int = 2;

pub const QP_STATE: c_int = 1;
pub const QP_ACCESS_FLAGS: c_int = 8;
pub const QP_PKEY_INDEX: c_int = 16;
pub const QP_PORT: c_int = 32;
pub const QP_AV: c_int = 128;
pub const QP_PATH_MTU: c_int = 256;
pub const QP_TIMEOUT: c_int = 512;
pub const QP_RETRY_CNT: c_int = 1024;
pub const QP_RNR_RETRY: c_int = 2048;
pub const QP_RQ_PSN: c_int = 4096;
pub const QP_MAX_QP_RD_ATOMIC: c_int = 8192;
pub const QP_MIN_RNR_TIMER: c_int = 32768;
pub const QP_SQ_PSN: c_int = 65536;
pub const QP_MAX_DEST_RD_ATOMIC: c_int = 131072;
pub const QP_DEST_QPN: c_int = 1048576;

pub const WC_SUCCESS: u32 = 0;
pub const WC_LOC_PROT_ERR: u32 = 4;
pub const WC_WR_FLUSH_ERR: u32 = 5;
pub const WC_REM_ACCESS_ERR: u32 = 10;
pub const WC_RNR_RETRY_EXC_ERR: u32 = 13;

/// Offsets in `struct ibv_context` of the data-path ops (inline functions in verbs.h).
const CTX_POLL_CQ: usize = 96;
const CTX_POST_SEND: usize = 208;
const CTX_POST_RECV: usize = 216;
/// Offset of `qp_num` in `struct ibv_qp`, of `lkey`/`rkey` in `struct ibv_mr`.
const QP_NUM: usize = 52;
const MR_LKEY: usize = 36;
const MR_RKEY: usize = 40;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

impl Sge {
    /// The first `length` bytes of `buf`, under memory key `lkey`.
    pub fn of(buf: &[u8], length: u32, lkey: u32) -> Sge {
        Sge {
            addr: buf.as_ptr() as u64,
            length,
            lkey,
        }
    }
}

#[repr(C)]
pub struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    _pad: u32,
}

impl RecvWr {
    pub fn new(wr_id: u64, sge: &mut Sge) -> RecvWr {
        RecvWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
            _pad: 0,
        }
    }
}

/// `struct ibv_send_wr` (128 bytes); only the RDMA part of the `wr` union is named.
#[repr(C)]
pub struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _pad: u32,
    _rest: [u64; 9],
}

impl SendWr {
    pub fn new(wr_id: u64, opcode: u32, sge: &mut Sge) -> SendWr {
        SendWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
            opcode,
            send_flags: SEND_SIGNALED,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _pad: 0,
            _rest: [0; 9],
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    _pad: [u8; 2],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    _pad: u32,
}

impl QpInitAttr {
    pub fn rc(cq: *mut c_void) -> QpInitAttr {
        QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QPT_RC,
            sq_sig_all: 0,
            _pad: 0,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub _pad: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub _pad: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub _pad: u8,
    pub rate_limit: u32,
    pub _pad2: u32,
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void;
type ModifyQp = unsafe extern "C" fn(*mut c_void, *mut QpAttr, c_int) -> c_int;
type QueryQp = unsafe extern "C" fn(*mut c_void, *mut QpAttr, c_int, *mut QpInitAttr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut c_void, u8, c_int, *mut [u8; 16]) -> c_int;
type WcStatusStr = unsafe extern "C" fn(u32) -> *const c_char;
type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut c_void, *mut RecvWr, *mut *mut RecvWr) -> c_int;

/// Why the probe could not run: libibverbs or a device was not there, or a verbs call
/// that sets up the probe failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error(
        "libibverbs is not installed here (apt-get install libibverbs1 ibverbs-providers): {0}"
    )]
    NotInstalled(#[source] libloading::Error),
    #[error("libibverbs lacks {symbol}: {source}")]
    Lacks {
        symbol: String,
        source: libloading::Error,
    },
    #[error("ibv_get_device_list failed (no verbs devices)")]
    NoDevices,
    #[error("no verbs device {name} (devices: {})", .devices.join(", "))]
    NoDevice { name: String, devices: Vec<String> },
    #[error("ibv_open_device({0}) failed")]
    Open(String),
    /// A call that returned NULL (`ibv_alloc_pd`, `ibv_create_cq`, `ibv_create_qp`).
    #[error("{0} failed")]
    Null(&'static str),
    #[error("ibv_reg_mr failed (memlock limit?)")]
    RegMr,
    #[error("{name} port {port} has no IPv4-mapped GID (is the netdev addressed?)")]
    NoMappedGid { name: String, port: u8 },
}

/// The loaded library and its entry points.
pub struct Verbs {
    _lib: Library,
    pub get_device_list: GetDeviceList,
    pub free_device_list: FreeDeviceList,
    pub get_device_name: GetDeviceName,
    pub open_device: OpenDevice,
    pub close_device: CloseDevice,
    pub alloc_pd: AllocPd,
    pub dealloc_pd: Destroy,
    pub reg_mr: RegMr,
    pub dereg_mr: Destroy,
    pub create_cq: CreateCq,
    pub destroy_cq: Destroy,
    pub create_qp: CreateQp,
    pub destroy_qp: Destroy,
    pub modify_qp: ModifyQp,
    pub query_qp: QueryQp,
    pub query_gid: QueryGid,
    pub wc_status_str: WcStatusStr,
}

impl Verbs {
    /// dlopen libibverbs.so.1 and resolve what the probe calls.
    pub fn load() -> Result<Verbs, VerbsError> {
        // SAFETY: loading libibverbs runs its constructors, which only register providers.
        let lib = unsafe { Library::new("libibverbs.so.1") }.map_err(VerbsError::NotInstalled)?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol has the C signature declared by the field's type
                // (rdma-core's verbs.h); the library outlives the pointer (kept in _lib).
                *unsafe { lib.get($name) }.map_err(|source| VerbsError::Lacks {
                    symbol: String::from_utf8_lossy($name).into_owned(),
                    source,
                })?
            };
        }
        Ok(Verbs {
            get_device_list: sym!(b"ibv_get_device_list"),
            free_device_list: sym!(b"ibv_free_device_list"),
            get_device_name: sym!(b"ibv_get_device_name"),
            open_device: sym!(b"ibv_open_device"),
            close_device: sym!(b"ibv_close_device"),
            alloc_pd: sym!(b"ibv_alloc_pd"),
            dealloc_pd: sym!(b"ibv_dealloc_pd"),
            reg_mr: sym!(b"ibv_reg_mr"),
            dereg_mr: sym!(b"ibv_dereg_mr"),
            create_cq: sym!(b"ibv_create_cq"),
            destroy_cq: sym!(b"ibv_destroy_cq"),
            create_qp: sym!(b"ibv_create_qp"),
            destroy_qp: sym!(b"ibv_destroy_qp"),
            modify_qp: sym!(b"ibv_modify_qp"),
            query_qp: sym!(b"ibv_query_qp"),
            query_gid: sym!(b"ibv_query_gid"),
            wc_status_str: sym!(b"ibv_wc_status_str"),
            _lib: lib,
        })
    }

    /// The status name libibverbs gives a completion status.
    pub fn status_name(&self, status: u32) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let p = unsafe { (self.wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Read a pointer-sized field at `offset` of a C object.
///
/// # Safety
/// `obj` must point to a live object at least `offset + 8` bytes long.
unsafe fn field<T: Copy>(obj: *mut c_void, offset: usize) -> T {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::read_unaligned((obj as *const u8).add(offset) as *const T) }
}

/// # Safety
/// `ctx` is a live `struct ibv_context *`.
pub unsafe fn poll_cq(ctx: *mut c_void, cq: *mut c_void, wc: &mut Wc) -> c_int {
    // SAFETY: the ops table is part of the context (verbs.h inline ibv_poll_cq).
    unsafe {
        let f: PollCq = field(ctx, CTX_POLL_CQ);
        f(cq, 1, wc)
    }
}

/// # Safety
/// `ctx` and `qp` are live; `wr` and its SGE outlive the call.
pub unsafe fn post_send(ctx: *mut c_void, qp: *mut c_void, wr: &mut SendWr) -> c_int {
    let mut bad: *mut SendWr = std::ptr::null_mut();
    // SAFETY: as ibv_post_send does.
    unsafe {
        let f: PostSend = field(ctx, CTX_POST_SEND);
        f(qp, wr, &mut bad)
    }
}

/// # Safety
/// `ctx` and `qp` are live; `wr` and its SGE outlive the call.
pub unsafe fn post_recv(ctx: *mut c_void, qp: *mut c_void, wr: &mut RecvWr) -> c_int {
    let mut bad: *mut RecvWr = std::ptr::null_mut();
    // SAFETY: as ibv_post_recv does.
    unsafe {
        let f: PostRecv = field(ctx, CTX_POST_RECV);
        f(qp, wr, &mut bad)
    }
}

/// # Safety
/// `qp` is a live `struct ibv_qp *`.
pub unsafe fn qp_num(qp: *mut c_void) -> u32 {
    // SAFETY: guaranteed by the caller.
    unsafe { field(qp, QP_NUM) }
}

/// # Safety
/// `mr` is a live `struct ibv_mr *`.
pub unsafe fn mr_keys(mr: *mut c_void) -> (u32, u32) {
    // SAFETY: guaranteed by the caller.
    unsafe { (field(mr, MR_LKEY), field(mr, MR_RKEY)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets printed by a C program compiled against rdma-core 44's verbs.h.
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(size_of::<Sge>(), 16);
        assert_eq!(size_of::<RecvWr>(), 32);
        assert_eq!(size_of::<SendWr>(), 128);
        assert_eq!(offset_of!(SendWr, num_sge), 24);
        assert_eq!(offset_of!(SendWr, opcode), 28);
        assert_eq!(offset_of!(SendWr, send_flags), 32);
        assert_eq!(offset_of!(SendWr, remote_addr), 40);
        assert_eq!(size_of::<Wc>(), 48);
        assert_eq!(offset_of!(Wc, status), 8);
        assert_eq!(offset_of!(Wc, vendor_err), 16);
        assert_eq!(offset_of!(Wc, qp_num), 28);
        assert_eq!(size_of::<QpInitAttr>(), 64);
        assert_eq!(offset_of!(QpInitAttr, cap), 32);
        assert_eq!(offset_of!(QpInitAttr, qp_type), 52);
        assert_eq!(offset_of!(QpInitAttr, sq_sig_all), 56);
        assert_eq!(size_of::<GlobalRoute>(), 24);
        assert_eq!(offset_of!(GlobalRoute, flow_label), 16);
        assert_eq!(offset_of!(GlobalRoute, sgid_index), 20);
        assert_eq!(offset_of!(GlobalRoute, hop_limit), 21);
        assert_eq!(size_of::<AhAttr>(), 32);
        assert_eq!(offset_of!(AhAttr, dlid), 24);
        assert_eq!(offset_of!(AhAttr, sl), 26);
        assert_eq!(offset_of!(AhAttr, is_global), 29);
        assert_eq!(offset_of!(AhAttr, port_num), 30);
        assert_eq!(size_of::<QpAttr>(), 144);
        assert_eq!(offset_of!(QpAttr, path_mtu), 8);
        assert_eq!(offset_of!(QpAttr, rq_psn), 20);
        assert_eq!(offset_of!(QpAttr, sq_psn), 24);
        assert_eq!(offset_of!(QpAttr, dest_qp_num), 28);
        assert_eq!(offset_of!(QpAttr, qp_access_flags), 32);
        assert_eq!(offset_of!(QpAttr, cap), 36);
        assert_eq!(offset_of!(QpAttr, ah_attr), 56);
        assert_eq!(offset_of!(QpAttr, alt_ah_attr), 88);
        assert_eq!(offset_of!(QpAttr, pkey_index), 120);
        assert_eq!(offset_of!(QpAttr, max_rd_atomic), 126);
        assert_eq!(offset_of!(QpAttr, max_dest_rd_atomic), 127);
        assert_eq!(offset_of!(QpAttr, min_rnr_timer), 128);
        assert_eq!(offset_of!(QpAttr, port_num), 129);
        assert_eq!(offset_of!(QpAttr, timeout), 130);
        assert_eq!(offset_of!(QpAttr, retry_cnt), 131);
        assert_eq!(offset_of!(QpAttr, rnr_retry), 132);
        assert_eq!(offset_of!(QpAttr, rate_limit), 136);
    }

    #[test]
    fn loads_where_libibverbs_is_installed() {
        // On a host without libibverbs this is the clear error, not a crash.
        match Verbs::load() {
            Ok(v) => assert_eq!(v.status_name(WC_LOC_PROT_ERR), "local protection error"),
            Err(e) => assert!(
                matches!(e, VerbsError::NotInstalled(_)) && e.to_string().contains("libibverbs"),
                "{e}"
            ),
        }
    }
}
