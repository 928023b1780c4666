//! TensorBoard event files, read as they grow: TFRecord framing (a little-endian u64
//! length, its masked CRC-32C, the data, the data's masked CRC-32C) around `Event` protos
//! whose `Summary` values are scalars (`simple_value`, or a one-element float or double
//! tensor of the `scalars` plugin, as TF2's `tf.summary.scalar` writes them).
//!
//! Pure: a reader is given the bytes that follow its offset and says how far it got. A
//! record cut short by the end of what was written so far is left for the next read; a
//! record whose length or data fails its CRC, or whose length is over [`MAX_RECORD`], makes
//! the file [`Damage`]d: the reader stops there for good (the file is skipped, once, with
//! the reason), never reading a length it cannot trust.

use prost::Message;

/// The longest record read (a scalar event is tens of bytes; images and histograms a few
/// MiB at most).
pub const MAX_RECORD: u64 = 16 << 20;

/// What the data of a file says about itself, when it cannot be read on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    LengthCrc { at: u64 },
    DataCrc { at: u64 },
    TooLong { at: u64, length: u64 },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::LengthCrc { at } => write!(f, "the record at byte {at} has a length that fails its CRC"),
            Damage::DataCrc { at } => write!(f, "the record at byte {at} fails its data CRC"),
            Damage::TooLong { at, length } => write!(f, "the record at byte {at} says it is {length} bytes long (at most {MAX_RECORD} are read)"),
        }
    }
}

/// One scalar of an event file.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    /// Seconds since the epoch.
    pub wall_time: f64,
    pub value: f64,
}

/// What one read of new bytes found.
#[derive(Debug, Default, PartialEq)]
pub struct Read {
    pub scalars: Vec<Scalar>,
    /// Bytes of whole records read (the offset moves on by this much).
    pub consumed: u64,
    /// Records that are not events this reader knows (or hold no scalar): skipped.
    pub skipped: usize,
    pub damage: Option<Damage>,
}

fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// The records in `buf` (the file's bytes from `offset`), as far as they are whole.
pub fn read(buf: &[u8], offset: u64) -> Read {
    let mut out = Read::default();
    let mut at = 0usize;
    loop {
        let rest = &buf[at..];
        if rest.len() < 12 {
            break;
        }
        let len_bytes = &rest[..8];
        let length = u64::from_le_bytes(len_bytes.try_into().unwrap_or([0; 8]));
        let len_crc = u32::from_le_bytes(rest[8..12].try_into().unwrap_or([0; 4]));
        let here = offset + at as u64;
        if masked_crc(len_bytes) != len_crc {
            out.damage = Some(Damage::LengthCrc { at: here });
            break;
        }
        if length > MAX_RECORD {
            out.damage = Some(Damage::TooLong { at: here, length });
            break;
        }
        let total = 12 + length as usize + 4;
        if rest.len() < total {
            break;
        }
        let data = &rest[12..12 + length as usize];
        let data_crc = u32::from_le_bytes(rest[12 + length as usize..total].try_into().unwrap_or([0; 4]));
        if masked_crc(data) != data_crc {
            out.damage = Some(Damage::DataCrc { at: here });
            break;
        }
        match scalars_of(data) {
            Some(s) if !s.is_empty() => out.scalars.extend(s),
            _ => out.skipped += 1,
        }
        at += total;
        out.consumed = at as u64;
    }
    out
}

#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    /// DT_FLOAT = 1, DT_DOUBLE = 2.
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(bytes = "vec", tag = "4")]
    tensor_content: Vec<u8>,
    #[prost(float, repeated, tag = "5")]
    float_val: Vec<f32>,
    #[prost(double, repeated, tag = "6")]
    double_val: Vec<f64>,
}

fn tensor_scalar(t: &TensorProto) -> Option<f64> {
    if let [v] = t.float_val.as_slice() {
        return Some(f64::from(*v));
    }
    if let [v] = t.double_val.as_slice() {
        return Some(*v);
    }
    match (t.dtype, t.tensor_content.len()) {
        (1, 4) => Some(f64::from(f32::from_le_bytes(t.tensor_content[..4].try_into().ok()?))),
        (2, 8) => Some(f64::from_le_bytes(t.tensor_content[..8].try_into().ok()?)),
        _ => None,
    }
}

/// The scalars of one event record; None when it is not an `Event`.
fn scalars_of(data: &[u8]) -> Option<Vec<Scalar>> {
    let e = Event::decode(data).ok()?;
    let Some(summary) = e.summary else { return Some(Vec::new()) };
    let mut out = Vec::new();
    for v in summary.value {
        let value = match (&v.simple_value, &v.tensor) {
            (Some(x), _) => Some(f64::from(*x)),
            (None, Some(t)) => {
                let plugin = v.metadata.as_ref().and_then(|m| m.plugin_data.as_ref()).map(|p| p.plugin_name.as_str());
                if matches!(plugin, Some("scalars") | None) { tensor_scalar(t) } else { None }
            }
            _ => None,
        };
        if let Some(value) = value {
            if !v.tag.is_empty() {
                out.push(Scalar { tag: v.tag, step: e.step, wall_time: e.wall_time, value });
            }
        }
    }
    Some(out)
}

/// A record as a writer frames it (for tests and benches).
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// An event record with one scalar per tag, as `SummaryWriter.add_scalar` writes it
/// (`simple_value`), framed (for tests and benches).
pub fn scalar_record(step: i64, wall_time: f64, values: &[(&str, f32)]) -> Vec<u8> {
    let e = Event {
        wall_time,
        step,
        summary: Some(Summary {
            value: values.iter().map(|(t, v)| SummaryValue { tag: (*t).into(), simple_value: Some(*v), tensor: None, metadata: None }).collect(),
        }),
    };
    frame(&e.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole records are read, a cut one waits for the rest, both scalar forms are
    /// understood (simple_value, and a TF2 float tensor of the scalars plugin), a record
    /// that is not a scalar event is skipped.
    #[test]
    fn scalars_from_records_as_they_grow() {
        let mut file = frame(&Event { wall_time: 1.0, step: 0, summary: None }.encode_to_vec());
        file.extend(scalar_record(1, 2.5, &[("loss", 0.5), ("acc", 0.25)]));
        let tf2 = Event {
            wall_time: 3.0,
            step: 2,
            summary: Some(Summary {
                value: vec![SummaryValue {
                    tag: "loss".into(),
                    simple_value: None,
                    tensor: Some(TensorProto { dtype: 1, tensor_content: 0.125f32.to_le_bytes().to_vec(), float_val: vec![], double_val: vec![] }),
                    metadata: Some(SummaryMetadata { plugin_data: Some(PluginData { plugin_name: "scalars".into() }) }),
                }],
            }),
        };
        file.extend(frame(&tf2.encode_to_vec()));
        let whole = file.len() as u64;
        file.extend(&scalar_record(3, 4.0, &[("loss", 0.1)])[..10]);
        let r = read(&file, 0);
        assert_eq!(r.consumed, whole);
        assert_eq!(r.skipped, 1);
        assert_eq!(r.damage, None);
        let got: Vec<(&str, i64, f64)> = r.scalars.iter().map(|s| (s.tag.as_str(), s.step, s.value)).collect();
        assert_eq!(got, vec![("loss", 1, 0.5), ("acc", 1, 0.25), ("loss", 2, 0.125)]);
        assert_eq!(read(&file[whole as usize..], whole).consumed, 0, "the cut record waits");
    }

    /// A bad length CRC, a bad data CRC and a length of 2^63 are damage named with the
    /// record's place; what came before is kept.
    #[test]
    fn damaged_records_stop_the_reader_with_the_reason() {
        let good = scalar_record(1, 1.0, &[("x", 1.0)]);
        let n = good.len() as u64;
        let mut bad_len = good.clone();
        bad_len.extend(&good);
        bad_len[n as usize + 8] ^= 1;
        let r = read(&bad_len, 0);
        assert_eq!((r.consumed, r.damage.clone()), (n, Some(Damage::LengthCrc { at: n })));
        assert_eq!(r.scalars.len(), 1);
        let mut bad_data = good.clone();
        let last = bad_data.len() - 1;
        bad_data[last] ^= 1;
        assert_eq!(read(&bad_data, 100).damage, Some(Damage::DataCrc { at: 100 }));
        let huge = (1u64 << 63).to_le_bytes();
        let mut bomb = huge.to_vec();
        bomb.extend(masked_crc(&huge).to_le_bytes());
        let r = read(&bomb, 0);
        assert_eq!(r.damage, Some(Damage::TooLong { at: 0, length: 1 << 63 }));
        assert!(r.damage.unwrap().to_string().contains("at most"));
    }
}
