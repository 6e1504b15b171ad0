use super::*;

/// A tensor's shape, its values, and the quantized format it claims (its blocks are then its
/// values as bytes).
type Held = (Vec<usize>, Vec<f32>, Option<QuantType>);

/// A file of named tensors held in memory.
#[derive(Default)]
struct Memory {
    tensors: BTreeMap<String, Held>,
}

impl Memory {
    fn add(&mut self, name: &str, shape: &[usize], first: f32, q: Option<QuantType>) {
        let n = shape.iter().product::<usize>();
        self.tensors.insert(name.into(), (shape.to_vec(), (0..n).map(|i| first + i as f32).collect(), q));
    }
}

impl TensorSource for Memory {
    fn naming(&self) -> Naming {
        Naming::Gguf
    }
    fn names(&self) -> BTreeSet<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.0.clone())
    }
    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        self.tensors.get(name).map(|t| Ok(t.2.map_or(Stored::F32, Stored::Quant)))
    }
    fn data(&self, name: &str, _dtype: DType) -> Result<TensorData, LoadError> {
        let (shape, values, _) = self.tensors.get(name).ok_or_else(|| LoadError::MissingTensors(vec![name.into()]))?;
        Ok(TensorData::new(values.clone(), shape.clone()))
    }
    fn blocks(&self, name: &str) -> Option<(QuantType, Cow<'_, [u8]>)> {
        let (_, values, q) = self.tensors.get(name)?;
        Some((q.as_ref().copied()?, Cow::Owned(values.iter().map(|&v| v as u8).collect())))
    }
}

/// Two layers of four experts, 3 outputs of 2 inputs (down: 2 of 3).
fn config() -> ModelConfig {
    ModelConfig::from_json_str(
        r#"{"model_type":"mixtral","hidden_size":2,"num_hidden_layers":2,"num_attention_heads":1,
        "intermediate_size":3,"vocab_size":8,"max_position_embeddings":16,"num_local_experts":4,
        "num_experts_per_tok":2}"#,
    )
    .unwrap()
}

/// Layer `l`'s experts, one tensor each; expert e's values start at `100 · l + 10 · e`.
fn split_layer(m: &mut Memory, l: usize, q: Option<QuantType>) {
    for e in 0..4 {
        let first = (100 * l + 10 * e) as f32;
        m.add(&format!("blk.{l}.ffn_gate.{e}.weight"), &[3, 2], first, q);
        m.add(&format!("blk.{l}.ffn_up.{e}.weight"), &[3, 2], first + 1.0, q);
        m.add(&format!("blk.{l}.ffn_down.{e}.weight"), &[2, 3], first + 2.0, q);
    }
    m.add(&format!("blk.{l}.ffn_gate_inp.weight"), &[4, 2], 0.0, None);
}

fn values(src: &dyn TensorSource, name: &str) -> Vec<f32> {
    src.data(name, DType::F32).unwrap().try_into_vec::<f32>().unwrap()
}

/// Each layer's experts read as one [experts, out, in] tensor under the stacked name, expert
/// after expert, their own names gone; values and blocks alike. The other tensors pass through.
#[test]
fn per_expert_tensors_read_as_the_stacked_tensor() {
    let mut m = Memory::default();
    split_layer(&mut m, 0, None);
    split_layer(&mut m, 1, Some(QuantType::Q8_0));
    let src = SplitExperts::wrap(Box::new(m), &config()).unwrap();
    let names = src.names();
    assert!(names.contains("blk.1.ffn_down_exps.weight") && names.contains("blk.0.ffn_gate_inp.weight"));
    assert!(!names.iter().any(|n| n.contains(".ffn_gate.") || n.contains(".ffn_down.")), "{names:?}");
    assert_eq!(names.len(), 2 * 4);
    assert_eq!(src.shape("blk.0.ffn_gate_exps.weight"), Some(vec![4, 3, 2]));
    assert_eq!(src.shape("blk.1.ffn_down_exps.weight"), Some(vec![4, 2, 3]));
    assert_eq!(src.stored("blk.1.ffn_up_exps.weight"), Some(Ok(Stored::Quant(QuantType::Q8_0))));
    let up: Vec<f32> = (0..4).flat_map(|e| (0..6).map(move |i| (10 * e + 1 + i) as f32)).collect();
    assert_eq!(values(src.as_ref(), "blk.0.ffn_up_exps.weight"), up);
    assert_eq!(src.data("blk.0.ffn_up_exps.weight", DType::F32).unwrap().shape().as_slice(), [4, 3, 2]);
    let (q, bytes) = src.blocks("blk.1.ffn_down_exps.weight").unwrap();
    let down: Vec<u8> = (0..4).flat_map(|e| (0..6).map(move |i| (100 + 10 * e + 2 + i) as u8)).collect();
    assert_eq!((q, bytes.into_owned()), (QuantType::Q8_0, down));
    assert_eq!(values(src.as_ref(), "blk.0.ffn_gate_inp.weight"), (0..8).map(|i| i as f32).collect::<Vec<_>>());
    assert!(src.blocks("blk.0.ffn_gate_exps.weight").is_none(), "f32 experts have no blocks");
}

/// A file with stacked experts (or none) is read as it is.
#[test]
fn stacked_experts_are_left_as_they_are() {
    let mut m = Memory::default();
    for l in 0..2 {
        m.add(&format!("blk.{l}.ffn_gate_exps.weight"), &[4, 3, 2], 0.0, None);
    }
    let src = SplitExperts::wrap(Box::new(m), &config()).unwrap();
    assert_eq!(
        src.names().into_iter().collect::<Vec<_>>(),
        ["blk.0.ffn_gate_exps.weight", "blk.1.ffn_gate_exps.weight"]
    );
}

/// An expert missing, or one of another shape or type than the first, is an error naming it.
#[test]
fn a_missing_or_odd_expert_is_named() {
    let mut m = Memory::default();
    split_layer(&mut m, 0, None);
    m.tensors.remove("blk.0.ffn_up.2.weight");
    let err = SplitExperts::wrap(Box::new(m), &config()).err().unwrap().to_string();
    assert!(err.contains("blk.0.ffn_up.2.weight"), "{err}");

    for (shape, q) in [([2, 3], None), ([3, 2], Some(QuantType::Q8_0))] {
        let mut m = Memory::default();
        split_layer(&mut m, 0, None);
        m.add("blk.0.ffn_gate.3.weight", &shape, 0.0, q);
        let err = SplitExperts::wrap(Box::new(m), &config()).err().unwrap().to_string();
        assert!(err.contains("blk.0.ffn_gate.3.weight") && err.contains("blk.0.ffn_gate.0.weight"), "{err}");
    }
}
