"""Write the bundled two-hop set ``kb_zh_hops`` (ragexp/data/kb_zh_hops): a small knowledge base
of products and the companies that make them, and questions whose answer needs both: the
product's page names its maker (the bridge), the maker's page holds the answer.

Run once; the output files are committed (``dataset=kb_zh_hops``). Deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "ragexp" / "data" / "kb_zh_hops"

# (id, name, founded, city, founder, known for)
MAKERS = [
    ("lanchuan", "澜川电器", 1998, "杭州", "周启明", "小家电"),
    ("beiyuan", "北垣科技", 2006, "合肥", "林若溪", "智能门锁"),
    ("qingmu", "青木家居", 2011, "佛山", "陈柏舟", "实木家具"),
    ("yunshao", "云杓厨具", 1995, "阳江", "黄守诚", "刀具和锅具"),
    ("xingtu", "星途户外", 2014, "厦门", "许安然", "露营装备"),
    ("mingjian", "明笺文具", 2003, "宁波", "郑怀瑾", "书写工具"),
    ("haiyin", "海音声学", 2009, "深圳", "罗一帆", "耳机和音箱"),
    ("songhe", "松禾母婴", 2016, "成都", "唐晓棠", "婴童用品"),
    ("jinglan", "镜岚美妆", 2012, "上海", "白芷涵", "护肤品"),
    ("fengchi", "风驰车品", 2008, "重庆", "韩振宇", "车载用品"),
    ("muye", "牧野宠物", 2015, "青岛", "孙牧之", "宠物食品"),
    ("chenguang", "晨光茶业", 1992, "福州", "吴清和", "乌龙茶"),
    ("yuxi", "玉溪纺织", 1987, "南通", "钱素云", "床上用品"),
    ("tianqu", "天衢运动", 2010, "晋江", "蔡鸿飞", "跑鞋"),
    ("zhuoyue", "卓越数码", 2005, "东莞", "冯子健", "移动电源"),
    ("shanlan", "山岚食品", 2001, "长沙", "易春华", "休闲零食"),
    ("baiyun", "白云清洁", 1999, "广州", "梁慧敏", "清洁用品"),
    ("guangling", "广陵灯饰", 2004, "中山", "何明远", "灯具"),
    ("jiangyue", "江月箱包", 2007, "白沟", "马俊杰", "旅行箱"),
    ("qiyun", "栖云园艺", 2017, "昆明", "杨舒窈", "园艺工具"),
    ("tongxin", "同心健康", 2002, "苏州", "朱仲文", "血压计"),
    ("longteng", "龙腾玩具", 1996, "汕头", "郭志强", "益智玩具"),
    ("huazhang", "华章乐器", 1990, "天津", "邓雅琴", "钢琴"),
    ("lingfeng", "凌峰五金", 2000, "永康", "曹永福", "电动工具"),
    ("yaoguang", "瑶光眼镜", 2013, "丹阳", "潘佳怡", "眼镜"),
    ("ziteng", "紫藤陶瓷", 1989, "景德镇", "余德润", "餐具"),
    ("xuanyuan", "轩辕酒业", 1985, "宜宾", "谢宏达", "白酒"),
    ("qinghe", "清禾粮油", 1994, "哈尔滨", "董丰年", "大米"),
    ("mosheng", "墨笙书画", 2018, "西安", "崔墨林", "毛笔"),
    ("anlan", "安澜安防", 2011, "武汉", "陆建国", "监控摄像头"),
    ("xiyue", "熙悦服饰", 2009, "杭州", "沈婉清", "羊绒衫"),
    ("hongxing", "鸿星电动", 2012, "无锡", "彭立新", "电动自行车"),
]

# (id, product name, maker id, what it is and does)
PRODUCTS = [
    ("kettle", "星河电热水壶", "lanchuan", "一款 1.7 升容量、带 304 不锈钢内胆的电热水壶，支持 5 档保温"),
    ("ricecooker", "稻香电饭煲", "lanchuan", "一款 4 升的智能电饭煲，可预约 24 小时"),
    ("lock-s3", "守望 S3 指纹锁", "beiyuan", "一款支持指纹、密码和 NFC 三种开锁方式的智能门锁"),
    ("doorbell", "知客可视门铃", "beiyuan", "一款 2K 画质、支持夜视的可视门铃"),
    ("desk", "栖木书桌", "qingmu", "一张北美白橡木书桌，桌面宽 1.2 米"),
    ("bed", "安眠实木床", "qingmu", "一张樱桃木双人床，床板为排骨架结构"),
    ("knife", "锋尚主厨刀", "yunshao", "一把 8 英寸大马士革钢主厨刀"),
    ("wok", "铁韵炒锅", "yunshao", "一口 32 厘米的精铁炒锅，无涂层"),
    ("tent", "远山帐篷", "xingtu", "一顶可住 3 至 4 人的双层防雨帐篷"),
    ("chair", "漫游折叠椅", "xingtu", "一把承重 120 公斤的铝合金折叠椅"),
    ("pen", "砚池钢笔", "mingjian", "一支 EF 尖的铱金钢笔，可吸墨水"),
    ("notebook", "素笺笔记本", "mingjian", "一本 A5 大小、100 克道林纸的笔记本"),
    ("earbuds", "听澜降噪耳机", "haiyin", "一副主动降噪真无线耳机，续航 30 小时"),
    ("speaker", "回声蓝牙音箱", "haiyin", "一台 IPX7 防水的便携蓝牙音箱"),
    ("stroller", "小步婴儿推车", "songhe", "一辆可坐可躺、单手收车的婴儿推车"),
    ("bottle", "暖暖奶瓶", "songhe", "一只 240 毫升的玻璃奶瓶，带防胀气奶嘴"),
    ("serum", "澄光精华液", "jinglan", "一瓶含烟酰胺的提亮精华液，容量 30 毫升"),
    ("sunscreen", "晴空防晒乳", "jinglan", "一支 SPF50+ 的清爽防晒乳"),
    ("charger", "疾风车载充电器", "fengchi", "一款双口快充的车载充电器，最大功率 65 瓦"),
    ("dashcam", "明眸行车记录仪", "fengchi", "一台前后双录的行车记录仪"),
    ("catfood", "鲜肉猫粮", "muye", "一款含 80% 鲜肉的全价猫粮"),
    ("dogchew", "磨牙洁齿棒", "muye", "一款帮助狗狗清洁牙齿的咀嚼零食"),
    ("oolong", "岩韵大红袍", "chenguang", "一款中火烘焙的武夷岩茶"),
    ("jasmine", "白毫茉莉花茶", "chenguang", "一款七窨的茉莉花茶"),
    ("quilt", "云眠蚕丝被", "yuxi", "一床填充 100% 桑蚕丝的春秋被"),
    ("pillow", "安枕乳胶枕", "yuxi", "一只天然乳胶护颈枕"),
    ("runner", "逐风跑鞋", "tianqu", "一双碳板竞速跑鞋，鞋重 210 克"),
    ("sock", "轻羽运动袜", "tianqu", "一双速干的中筒运动袜"),
    ("powerbank", "续航者移动电源", "zhuoyue", "一台 20000 毫安时、支持 PD 快充的移动电源"),
    ("cable", "灵犀数据线", "zhuoyue", "一根 1 米长的编织快充数据线"),
    ("chips", "脆乡薯片", "shanlan", "一袋非油炸的烘焙薯片"),
    ("jerky", "辣妹子牛肉干", "shanlan", "一袋湘味香辣牛肉干"),
    ("detergent", "净朗洗衣液", "baiyun", "一瓶 2 公斤装的低泡洗衣液"),
    ("mop", "旋风拖把", "baiyun", "一把可脱水的旋转拖把"),
    ("lamp", "皓月台灯", "guangling", "一盏无频闪的护眼台灯"),
    ("chandelier", "星辰吊灯", "guangling", "一盏可调色温的客厅吊灯"),
    ("suitcase", "行云拉杆箱", "jiangyue", "一只 24 英寸的铝框拉杆箱"),
    ("backpack", "远行双肩包", "jiangyue", "一只可放 16 英寸电脑的双肩包"),
    ("shears", "修枝剪", "qiyun", "一把 SK5 钢刃的园艺修枝剪"),
    ("pot", "透气陶盆", "qiyun", "一只带托盘的红陶花盆"),
    ("bpmonitor", "安心电子血压计", "tongxin", "一台上臂式全自动电子血压计"),
    ("thermometer", "瞬测额温枪", "tongxin", "一支一秒出结果的红外额温枪"),
    ("blocks", "巧手积木", "longteng", "一套 500 颗粒的拼插积木"),
    ("puzzle", "九连环", "longteng", "一套木制传统益智九连环"),
    ("piano", "和弦立式钢琴", "huazhang", "一台 88 键的立式钢琴"),
    ("guzheng", "清音古筝", "huazhang", "一台 21 弦的梧桐木古筝"),
    ("drill", "劲锋电钻", "lingfeng", "一把 20 伏的无刷锂电钻"),
    ("saw", "利刃电圆锯", "lingfeng", "一台 185 毫米锯片的电圆锯"),
    ("glasses", "清澈近视镜", "yaoguang", "一副纯钛镜架的近视眼镜"),
    ("sunglasses", "烈日偏光墨镜", "yaoguang", "一副偏光驾驶墨镜"),
    ("teaset", "青花茶具", "ziteng", "一套手绘青花瓷茶具，含一壶六杯"),
    ("bowl", "玲珑米饭碗", "ziteng", "一套四只的玲珑瓷米饭碗"),
    ("baijiu", "窖藏五粮", "xuanyuan", "一款 52 度浓香型白酒"),
    ("liquor", "轩辕老酒", "xuanyuan", "一款窖藏十年的陈酿白酒"),
    ("rice", "五常稻花香米", "qinghe", "一袋 5 公斤装的东北大米"),
    ("oil", "压榨大豆油", "qinghe", "一桶 5 升的非转基因压榨大豆油"),
    ("brush", "狼毫毛笔", "mosheng", "一支适合写小楷的狼毫毛笔"),
    ("inkstone", "端砚", "mosheng", "一方带砚盖的端砚"),
    ("camera", "鹰眼摄像头", "anlan", "一台 400 万像素、支持云台转动的家用摄像头"),
    ("alarm", "警哨烟雾报警器", "anlan", "一台独立式光电烟雾报警器"),
    ("sweater", "暖阳羊绒衫", "xiyue", "一件 100% 山羊绒圆领衫"),
    ("scarf", "柔云围巾", "xiyue", "一条羊绒混纺的长围巾"),
    ("ebike", "疾行电动自行车", "hongxing", "一辆续航 60 公里的新国标电动自行车"),
    ("helmet", "护卫骑行头盔", "hongxing", "一顶带尾灯的骑行头盔"),
]

# What a question asks about the maker: (question template, the fact, the maker page's words)
ASKS = [
    ("{product}是哪家公司出的？这家公司的总部在哪个城市？", "{city}", "总部位于{city}"),
    ("生产{product}的企业是哪一年成立的？", "{year}年", "成立于{year}年"),
    ("{product}背后的品牌，创始人是谁？", "{founder}", "创始人是{founder}"),
    ("我想了解一下{product}的厂家，它最早是做什么起家的？", "{known}", "以{known}起家"),
]


def main() -> None:
    makers = {m[0]: m for m in MAKERS}
    docs = []
    for key, name, year, city, founder, known in MAKERS:
        text = f"{name}成立于{year}年，总部位于{city}，创始人是{founder}，以{known}起家。"
        docs.append({"id": f"maker-{key}", "title": name, "text": text})
    for key, product, maker, what in PRODUCTS:
        text = f"{product}是{what}。该产品由{makers[maker][1]}生产，全国联保一年。"
        docs.append({"id": f"product-{key}", "title": product, "text": text})
    cases = []
    for index, (key, product, maker, _) in enumerate(PRODUCTS):
        _, name, year, city, founder, known = makers[maker]
        values = {"product": product, "year": year, "city": city, "founder": founder, "known": known}
        question, fact, words = ASKS[index % len(ASKS)]
        cases.append(
            {
                "id": f"hop-{key}",
                "question": question.format(**values),
                "hops": [
                    {"relevant": [{"doc": f"product-{key}", "span": f"该产品由{name}生产"}], "bridge": name},
                    {"relevant": [{"doc": f"maker-{maker}", "span": words.format(**values)}]},
                ],
                "expected_facts": [fact.format(**values)],
                "reference": f"{product}由{name}生产；{name}{words.format(**values)}。",
            }
        )
    OUT.mkdir(parents=True, exist_ok=True)
    for file, rows in (("docs.jsonl", docs), ("cases.jsonl", cases)):
        (OUT / file).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
