//! D1: the devices a model can run on, as `--device` spells them: `cpu` (Burn's Flex backend and
//! the CPU kernels), `wgpu[:N]` (Burn's wgpu backend on the best graphics API the machine has),
//! `vulkan[:N]` (pinned to Vulkan, SPIR-V), `gl` (pinned to OpenGL ES: Mesa's llvmpipe in CI) and
//! `cuda[:N]`. GPU spellings need the cargo feature that builds their backend (`wgpu`, `cuda`);
//! without it they are a clear error, not a silent fallback to the CPU.

use std::fmt;
use std::str::FromStr;

use burn::tensor::{Device, StreamId};

use crate::kv::KvDtype;

/// One device, as named on the command line. `Display` writes the canonical spelling (the
/// `device` label of the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    Cpu,
    /// The best graphics API's device: the N-th discrete GPU, or wgpu's own pick without N.
    Wgpu(Option<usize>),
    Vulkan(Option<usize>),
    Gl,
    Cuda(Option<usize>),
}

/// Why a `--device` value names no device this build can open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device '{0}' (cpu, wgpu[:N], vulkan[:N], gl, cuda[:N]; several as a comma-separated list)")]
    Unknown(String),
    #[error("device '{0}': the index must be a number (like vulkan:0)")]
    BadIndex(String),
    #[error(
        "device '{device}' needs a build with the `{feature}` cargo feature (cargo build --release --features {feature})"
    )]
    NotBuilt { device: String, feature: &'static str },
    #[error("device '{device}' cannot be opened: {reason}")]
    Unavailable { device: String, reason: String },
    #[error("no device given")]
    Empty,
    #[error(
        "device '{device}' does not compute in {dtype}, so its KV cache cannot be stored so (--kv-dtype f32, or auto)"
    )]
    KvDtype { device: String, dtype: KvDtype },
}

impl DeviceSpec {
    /// A comma-separated list (`cpu,vulkan:0`; the same device twice is two replicas).
    pub fn parse_list(list: &str) -> Result<Vec<DeviceSpec>, DeviceError> {
        let specs =
            list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::parse).collect::<Result<Vec<_>, _>>()?;
        if specs.is_empty() {
            return Err(DeviceError::Empty);
        }
        Ok(specs)
    }

    /// Whether this is the CPU (where packed quantized weights and the CPU kernels run).
    pub fn is_cpu(self) -> bool {
        self == Self::Cpu
    }

    /// The Burn device, or why it cannot be opened: its backend is not built in, or (wgpu) this
    /// machine has no such adapter or driver. A CUDA device is opened lazily, at the first
    /// tensor made on it.
    pub fn device(self) -> Result<Device, DeviceError> {
        match self {
            Self::Cpu => Ok(Device::flex()),
            Self::Wgpu(index) => self.opened(wgpu::device(index, wgpu::Api::Auto), "wgpu"),
            Self::Vulkan(index) => self.opened(wgpu::device(index, wgpu::Api::Vulkan), "wgpu"),
            Self::Gl => self.opened(wgpu::device(None, wgpu::Api::Gl), "wgpu"),
            Self::Cuda(index) => cuda::device(index).ok_or_else(|| self.not_built("cuda")),
        }
    }

    /// Refuses a KV cache element type `device` (this spec, opened) does not compute in, which
    /// would otherwise fail at the first forward pass (Mesa's llvmpipe has no 16-bit floats),
    /// and q8_0 off the CPU (only the CPU's attention reads its blocks).
    pub fn check_kv_dtype(self, device: &Device, dtype: KvDtype) -> Result<(), DeviceError> {
        let computes = match dtype {
            KvDtype::Q8_0 => self.is_cpu(),
            _ => device.supports_dtype(dtype.dtype()),
        };
        match computes {
            true => Ok(()),
            false => Err(DeviceError::KvDtype { device: self.to_string(), dtype }),
        }
    }

    fn not_built(self, feature: &'static str) -> DeviceError {
        DeviceError::NotBuilt { device: self.to_string(), feature }
    }

    fn opened(self, device: Option<Result<Device, String>>, feature: &'static str) -> Result<Device, DeviceError> {
        match device {
            Some(Ok(device)) => Ok(device),
            Some(Err(reason)) => Err(DeviceError::Unavailable { device: self.to_string(), reason }),
            None => Err(self.not_built(feature)),
        }
    }
}

/// The one device stream a model's work goes to, whichever thread submits it.
///
/// CubeCL gives each thread a stream of its own, and a launch that binds a buffer made on
/// another stream first submits that stream's queued work and its own, has its own wait for the
/// other's, and keeps the buffer until then (on wgpu: queue submits at that launch). A model whose
/// weights were loaded on one thread, whose KV cache was made on a second and whose steps ran
/// on the compute pool's threads (the server's worker) paid that at every launch binding a
/// weight (on llvmpipe, a step of the two-layer fixture: 14 launches, 25 bindings another stream
/// had not synchronised, 12 flushes of other streams). So a model
/// makes one stream at load ([`DeviceStream::for_device`]), and it and its [`Context`] enter it
/// for everything they put on the device or read back from it: its buffers are all the
/// stream's own, and its recorded steps replay on the stream they were recorded on.
///
/// On the CPU there is none: [`DeviceStream::enter`] just runs its closure.
///
/// [`Context`]: crate::Context
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DeviceStream(Option<StreamId>);

impl DeviceStream {
    /// A new stream on a GPU device; none on the CPU.
    pub fn for_device(device: &Device) -> Self {
        Self((*device != Device::flex()).then(StreamId::allocate))
    }

    /// Runs `f` with this stream as the thread's current one (the thread's own again after,
    /// an unwind included).
    pub fn enter<R>(self, f: impl FnOnce() -> R) -> R {
        match self.0 {
            Some(id) => id.executes(f),
            None => f(),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, DeviceError> {
        let lower = s.trim().to_ascii_lowercase();
        let (name, index) = match lower.split_once(':') {
            Some((name, index)) => {
                let index = index.parse::<usize>().map_err(|_| DeviceError::BadIndex(s.into()))?;
                (name, Some(index))
            }
            None => (lower.as_str(), None),
        };
        match (name, index) {
            ("cpu" | "flex", None) => Ok(Self::Cpu),
            ("wgpu", index) => Ok(Self::Wgpu(index)),
            ("vulkan", index) => Ok(Self::Vulkan(index)),
            ("gl" | "opengl", None) => Ok(Self::Gl),
            ("cuda", index) => Ok(Self::Cuda(index)),
            ("cpu" | "flex" | "gl" | "opengl", Some(_)) => Err(DeviceError::BadIndex(s.into())),
            _ => Err(DeviceError::Unknown(s.into())),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, index) = match *self {
            Self::Cpu => ("cpu", None),
            Self::Wgpu(i) => ("wgpu", i),
            Self::Vulkan(i) => ("vulkan", i),
            Self::Gl => ("gl", None),
            Self::Cuda(i) => ("cuda", i),
        };
        match index {
            Some(i) => write!(f, "{name}:{i}"),
            None => f.write_str(name),
        }
    }
}

/// The wgpu devices of this build: `None` without the `wgpu` feature.
#[cfg(feature = "wgpu")]
mod wgpu {
    use std::sync::{Mutex, PoisonError};

    use burn::cubecl::wgpu::{AutoGraphicsApi, RuntimeOptions, WgpuDevice, WgpuDeviceKind, try_init_setup};
    use burn::tensor::Device;

    pub use burn::cubecl::wgpu::WgpuBackend as Api;

    /// Devices brought up so far (a runtime is set up once per device; replicas share it).
    static OPENED: Mutex<Vec<WgpuDevice>> = Mutex::new(Vec::new());

    /// Brings the device up now, so that a missing adapter or driver is an error here rather
    /// than a panic in the backend's thread at the first tensor.
    pub fn device(index: Option<usize>, api: Api) -> Option<Result<Device, String>> {
        let kind = index.map_or(WgpuDeviceKind::DefaultDevice, WgpuDeviceKind::DiscreteGpu);
        let device = WgpuDevice::new(kind).on(api);
        let mut opened = OPENED.lock().unwrap_or_else(PoisonError::into_inner);
        if !opened.contains(&device) {
            if let Err(e) = try_init_setup::<AutoGraphicsApi>(&device, RuntimeOptions::default()) {
                return Some(Err(e.to_string()));
            }
            opened.push(device.clone());
        }
        Some(Ok(Device::new(device)))
    }
}

#[cfg(not(feature = "wgpu"))]
mod wgpu {
    use burn::tensor::Device;

    pub enum Api {
        Auto,
        Vulkan,
        Gl,
    }

    pub fn device(_: Option<usize>, _: Api) -> Option<Result<Device, String>> {
        None
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn::tensor::{Device, DeviceIndex};

    pub fn device(index: Option<usize>) -> Option<Device> {
        Some(Device::cuda(index.map_or(DeviceIndex::Default, DeviceIndex::Specified)))
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use burn::tensor::Device;

    pub fn device(_: Option<usize>) -> Option<Device> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_parse_to_their_canonical_names() {
        for (given, canonical) in [
            ("cpu", "cpu"),
            ("flex", "cpu"),
            ("WGPU", "wgpu"),
            ("wgpu:1", "wgpu:1"),
            ("vulkan:0", "vulkan:0"),
            ("opengl", "gl"),
            ("cuda:2", "cuda:2"),
        ] {
            assert_eq!(given.parse::<DeviceSpec>().unwrap().to_string(), canonical, "{given}");
        }
        let list = DeviceSpec::parse_list("cpu, cpu,vulkan:0").unwrap();
        assert_eq!(list, [DeviceSpec::Cpu, DeviceSpec::Cpu, DeviceSpec::Vulkan(Some(0))]);
    }

    #[test]
    fn bad_spellings_are_errors_that_say_what_is_accepted() {
        assert!(matches!("tpu".parse::<DeviceSpec>(), Err(DeviceError::Unknown(_))));
        assert!(matches!("vulkan:x".parse::<DeviceSpec>(), Err(DeviceError::BadIndex(_))));
        assert!(matches!("cpu:1".parse::<DeviceSpec>(), Err(DeviceError::BadIndex(_))));
        assert_eq!(DeviceSpec::parse_list(" , "), Err(DeviceError::Empty));
        assert!(DeviceError::Unknown("tpu".into()).to_string().contains("vulkan[:N]"));
    }

    #[test]
    fn the_cpu_always_opens_and_unbuilt_backends_name_their_feature() {
        assert_eq!(DeviceSpec::Cpu.device().unwrap(), Device::flex());
        for dtype in KvDtype::ALL {
            assert_eq!(DeviceSpec::Cpu.check_kv_dtype(&Device::flex(), dtype), Ok(()), "{dtype}");
        }
        assert!(DeviceSpec::Gl.check_kv_dtype(&Device::flex(), KvDtype::Q8_0).is_err(), "q8_0 is the CPU's only");
        let refused = DeviceError::KvDtype { device: "gl".into(), dtype: KvDtype::F16 }.to_string();
        assert!(refused.contains("does not compute in f16") && refused.contains("--kv-dtype f32"), "{refused}");
        #[cfg(not(feature = "cuda"))]
        match DeviceSpec::Cuda(None).device() {
            Err(DeviceError::NotBuilt { feature, .. }) => assert_eq!(feature, "cuda"),
            other => panic!("{other:?}"),
        }
        #[cfg(not(feature = "wgpu"))]
        match DeviceSpec::Vulkan(Some(0)).device() {
            Err(e) => assert!(e.to_string().contains("--features wgpu"), "{e}"),
            Ok(_) => panic!("vulkan opened without the wgpu feature"),
        }
    }
}
